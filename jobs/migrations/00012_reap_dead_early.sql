-- +goose Up
-- reap_dead_early lets the reaper fail a lost job of a long type without
-- waiting for its max_runtime: once the job's idle time reaches its stall
-- timeout, a PROCESSING job is reaped as lost_task when asynq expired its
-- task's lease (archived or completed with asynq's "task lease expired",
-- or the task is gone) and a live asynq server serves its queue, and the
-- worker that claimed it (its default host:pid name) is absent from
-- asynq's live-server registry. Off by default: every other job waits for
-- the full stall rule (runtime past max_runtime and idle for the stall
-- timeout).
ALTER TABLE job_types ADD COLUMN reap_dead_early boolean NOT NULL DEFAULT false;

-- +goose Down
ALTER TABLE job_types DROP COLUMN reap_dead_early;
