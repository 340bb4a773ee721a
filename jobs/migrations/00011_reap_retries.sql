-- +goose Up
-- A retry budget per job type: a stalled job, or a lost one whose task
-- asynq still holds, is run again up to reap_retries times per life of
-- its ID instead of failed. 0, the default, keeps the reap a failure.
ALTER TABLE job_types
    ADD COLUMN reap_retries integer NOT NULL DEFAULT 0 CHECK (reap_retries >= 0),
    -- The delay before a lost job's replaced task runs, doubled at every
    -- retry of the life: reap_retry_delay x 2^(reap_count - 1).
    ADD COLUMN reap_retry_delay interval NOT NULL DEFAULT '1 minute' CHECK (reap_retry_delay >= interval '0');

-- reap_count counts the retry reaps of the row's current life; a retry
-- reap is allowed while it is below its type's reap_retries. requeue keeps
-- it; a new life (an INSERT, or the UPDATE that starts one) resets it.
ALTER TABLE jobs ADD COLUMN reap_count integer NOT NULL DEFAULT 0 CHECK (reap_count >= 0);

-- The later passes look for retry-reaped rows whose next delivery asynq
-- stranded among the QUEUED rows that were ever retry-reaped: few. The
-- status is compared under COLLATE "C" (the same answer for these ASCII
-- words) so that the predicate is implied only by the statement that
-- names it so, never by one of jobs_queued_updated_idx's (status =
-- 'QUEUED') nor by the primary key's statements.
CREATE INDEX jobs_reap_retry_idx ON jobs (queue, id) WHERE status COLLATE "C" = 'QUEUED' AND reap_count > 0;

-- The lives trigger functions of 00003, now also resetting reap_count.
CREATE OR REPLACE FUNCTION jobs_start_life() RETURNS trigger LANGUAGE plpgsql
SET search_path FROM CURRENT AS $$
DECLARE
    prior bigint;
BEGIN
    SELECT GREATEST(
               (SELECT max(e.generation) FROM job_events e WHERE e.job_id = NEW.id),
               (SELECT max(b.generation) FROM job_batches b WHERE b.job_id = NEW.id),
               (SELECT p.generation FROM job_past_lives p WHERE p.job_id = NEW.id))
      INTO prior;
    IF prior IS NOT NULL AND NEW.generation <= prior THEN
        NEW.generation := prior + 1;
    END IF;
    NEW.first_generation := NEW.generation;
    NEW.reap_count := 0;
    RETURN NEW;
END $$;

CREATE OR REPLACE FUNCTION jobs_restart_life() RETURNS trigger LANGUAGE plpgsql
SET search_path FROM CURRENT AS $$
BEGIN
    NEW.generation := GREATEST(OLD.generation, NEW.generation) + 1;
    NEW.first_generation := NEW.generation;
    NEW.reap_count := 0;
    RETURN NEW;
END $$;

-- +goose Down
CREATE OR REPLACE FUNCTION jobs_restart_life() RETURNS trigger LANGUAGE plpgsql
SET search_path FROM CURRENT AS $$
BEGIN
    NEW.generation := GREATEST(OLD.generation, NEW.generation) + 1;
    NEW.first_generation := NEW.generation;
    RETURN NEW;
END $$;

CREATE OR REPLACE FUNCTION jobs_start_life() RETURNS trigger LANGUAGE plpgsql
SET search_path FROM CURRENT AS $$
DECLARE
    prior bigint;
BEGIN
    SELECT GREATEST(
               (SELECT max(e.generation) FROM job_events e WHERE e.job_id = NEW.id),
               (SELECT max(b.generation) FROM job_batches b WHERE b.job_id = NEW.id),
               (SELECT p.generation FROM job_past_lives p WHERE p.job_id = NEW.id))
      INTO prior;
    IF prior IS NOT NULL AND NEW.generation <= prior THEN
        NEW.generation := prior + 1;
    END IF;
    NEW.first_generation := NEW.generation;
    RETURN NEW;
END $$;

DROP INDEX jobs_reap_retry_idx;
ALTER TABLE jobs DROP COLUMN reap_count;
ALTER TABLE job_types DROP COLUMN reap_retry_delay, DROP COLUMN reap_retries;
