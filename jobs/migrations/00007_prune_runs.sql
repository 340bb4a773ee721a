-- +goose Up
-- prune_runs records each `jobreaper prune` that deleted history: job_events
-- cannot, since its rows name a job and a prune's rows name none. One row
-- per run, written after its DELETEs (a dry run writes none).
CREATE TABLE prune_runs (
    id         bigserial PRIMARY KEY,
    -- When the run was recorded, on the database clock.
    at         timestamptz NOT NULL DEFAULT now(),
    -- --older-than, and the database time finished_at was compared with
    -- (the run's now() minus older_than).
    older_than interval NOT NULL,
    cutoff     timestamptz NOT NULL,
    -- Rows deleted, per table.
    events     bigint NOT NULL,
    batches    bigint NOT NULL,
    -- false when an error stopped the run: the counts are what it had
    -- deleted until then.
    complete   boolean NOT NULL,
    -- Who ran it (user@host), NULL when unknown.
    operator   text
);

-- +goose Down
DROP TABLE prune_runs;
