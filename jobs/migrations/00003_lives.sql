-- +goose Up
-- A job ID may have more than one life: the product deletes a job's row and
-- inserts the same ID again (deterministic IDs such as
-- report:tenant42:2026-11-30, asynq's own deduplication idiom), or resets the
-- row by an UPDATE. What jobreaper keyed by the ID outlives the row:
-- job_events, job_batches, the Redis marker (which records a reaped
-- generation), the fencing tokens handed out. So a new life starts its
-- generation above every generation ever recorded for the ID, and every
-- generation fence (fenced writes, the marker's compare-and-set, the start
-- guard's marker check, the fencing token) keeps working unchanged.
--
-- The triggers' functions name no schema: they run with the search_path
-- this migration runs under (its own schema alone), captured at creation
-- (SET search_path FROM CURRENT), whatever the connection's search_path is
-- when the product inserts a row.

-- first_generation is the generation the row's current life started at:
-- the row's generation when it was inserted (after raising it above the
-- earlier lives'), or when an UPDATE started a new life. Every attempt of
-- the life has a generation at or above it, every earlier life's are below
-- it. Rows inserted before this migration keep 0 (their life started at 0),
-- so nothing derived from it changes for a job already in flight.
ALTER TABLE jobs ADD COLUMN first_generation bigint NOT NULL DEFAULT 0;

-- job_past_lives remembers, per deleted job ID, the highest generation its
-- row reached, so that a new life starts above it even when the ID's events
-- and batches were pruned. Rows that were never claimed (generation 0) handed
-- out no fence and are not recorded.
CREATE TABLE job_past_lives (
    job_id     text PRIMARY KEY,
    generation bigint NOT NULL,
    deleted_at timestamptz NOT NULL DEFAULT now()
);

-- A new row's generation starts above every generation recorded for its ID.
CREATE FUNCTION jobs_start_life() RETURNS trigger LANGUAGE plpgsql
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

CREATE TRIGGER jobs_start_life BEFORE INSERT ON jobs
    FOR EACH ROW EXECUTE FUNCTION jobs_start_life();

-- An UPDATE that moves the cursor backwards or lowers the generation starts
-- a new life of the row (jobreaper itself never does either: the cursor and
-- the generation only grow within a life): its generation goes above the
-- old one, and the life's first generation with it.
CREATE FUNCTION jobs_restart_life() RETURNS trigger LANGUAGE plpgsql
SET search_path FROM CURRENT AS $$
BEGIN
    NEW.generation := GREATEST(OLD.generation, NEW.generation) + 1;
    NEW.first_generation := NEW.generation;
    RETURN NEW;
END $$;

CREATE TRIGGER jobs_restart_life BEFORE UPDATE ON jobs
    FOR EACH ROW
    WHEN (NEW."cursor" < OLD."cursor" OR NEW.generation < OLD.generation)
    EXECUTE FUNCTION jobs_restart_life();

-- A deleted row leaves its highest generation behind, once per statement.
CREATE FUNCTION jobs_end_lives() RETURNS trigger LANGUAGE plpgsql
SET search_path FROM CURRENT AS $$
BEGIN
    INSERT INTO job_past_lives AS p (job_id, generation)
    SELECT d.id, d.generation FROM ended d WHERE d.generation > 0
    ON CONFLICT (job_id) DO UPDATE
       SET generation = GREATEST(p.generation, EXCLUDED.generation), deleted_at = now();
    RETURN NULL;
END $$;

CREATE TRIGGER jobs_end_lives AFTER DELETE ON jobs
    REFERENCING OLD TABLE AS ended
    FOR EACH STATEMENT EXECUTE FUNCTION jobs_end_lives();

-- +goose Down
DROP TRIGGER jobs_end_lives ON jobs;
DROP FUNCTION jobs_end_lives();
DROP TRIGGER jobs_restart_life ON jobs;
DROP FUNCTION jobs_restart_life();
DROP TRIGGER jobs_start_life ON jobs;
DROP FUNCTION jobs_start_life();
DROP TABLE job_past_lives;
ALTER TABLE jobs DROP COLUMN first_generation;
