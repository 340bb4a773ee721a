-- +goose Up
-- job_types holds the per-type limits the reaper applies. Intervals are
-- compared by PostgreSQL (30-day months, 24-hour days).
CREATE TABLE job_types (
    name          text PRIMARY KEY,
    -- Soft limit: a job may be reaped only once its runtime exceeds it.
    max_runtime   interval NOT NULL CHECK (max_runtime > interval '0'),
    -- NULL means the daemon's --stall-timeout.
    stall_timeout interval NULL CHECK (stall_timeout IS NULL OR stall_timeout > interval '0'),
    -- asynq's per-task Timeout; NULL means 24 hours.
    hard_timeout  interval NULL CHECK (hard_timeout IS NULL OR hard_timeout > interval '0'),
    -- A handler that returns nil without a confirmed Complete completes the
    -- job only when this is true; otherwise the job fails as no_completion.
    auto_complete boolean NOT NULL DEFAULT false
);

-- jobs is the product's record of each unit of work. No foreign key to
-- job_types: an unknown type is a counted skip, never a failed insert.
CREATE TABLE jobs (
    id             text PRIMARY KEY,
    type           text NOT NULL,
    status         text NOT NULL CHECK (status IN ('QUEUED', 'PROCESSING', 'COMPLETED', 'FAILED')),
    -- Fencing token: +1 at every claim.
    generation     bigint NOT NULL DEFAULT 0,
    worker         text,
    queue          text,
    parent_id      text,
    tenant_id      text,
    -- Start of the current attempt, set by the claim on the DB clock.
    started_at     timestamptz,
    -- Moved only by evidence of progress (claim, advancing heartbeat, Advance).
    updated_at     timestamptz NOT NULL DEFAULT now(),
    -- A fixed code (stalled, lost_task, no_completion, ...), never error text.
    failure_reason text,
    -- Last heartbeat progress mark of the current attempt.
    progress_mark  bigint NOT NULL DEFAULT 0,
    -- Resumable progress: cursor of total (total NULL: the job does not use Advance).
    "cursor"       bigint NOT NULL DEFAULT 0 CHECK ("cursor" >= 0),
    total          bigint CHECK (total IS NULL OR total >= "cursor"),
    created_at     timestamptz NOT NULL DEFAULT now(),
    finished_at    timestamptz
);

-- The reconciliation scan reads PROCESSING rows per queue.
CREATE INDEX jobs_processing_queue_idx ON jobs (queue, updated_at) WHERE status = 'PROCESSING';
-- Marker repair reads recently failed rows by reason and time.
CREATE INDEX jobs_failed_finished_idx ON jobs (finished_at) WHERE status = 'FAILED';
CREATE INDEX jobs_parent_idx ON jobs (parent_id) WHERE parent_id IS NOT NULL;

-- job_events is an append-only audit trail: claimed, reaped,
-- late_result_rejected, ... with the evidence in detail.
CREATE TABLE job_events (
    id         bigserial PRIMARY KEY,
    job_id     text NOT NULL,
    kind       text NOT NULL,
    at         timestamptz NOT NULL DEFAULT now(),
    generation bigint,
    worker     text,
    detail     jsonb NOT NULL DEFAULT '{}'
);
CREATE INDEX job_events_job_idx ON job_events (job_id, id);

-- job_batches records each Advance so that a replayed batch token returns
-- the stored cursor instead of moving it twice.
CREATE TABLE job_batches (
    job_id          text NOT NULL,
    token           text NOT NULL,
    generation      bigint NOT NULL,
    expected_cursor bigint NOT NULL,
    count           bigint NOT NULL,
    cursor_after    bigint NOT NULL,
    at              timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (job_id, token)
);

-- +goose Down
DROP TABLE job_batches;
DROP TABLE job_events;
DROP TABLE jobs;
DROP TABLE job_types;
