-- +goose Up
-- marker_set_at records when the reaper wrote the Redis marker of a reaped
-- job; a reaped row without it gets its marker re-set by a later pass
-- (with what is left of the marker's 7 days, never more).
ALTER TABLE jobs ADD COLUMN marker_set_at timestamptz;
CREATE INDEX jobs_marker_missing_idx ON jobs (finished_at)
    WHERE status = 'FAILED' AND marker_set_at IS NULL AND failure_reason IN ('stalled', 'lost_task');

-- +goose Down
DROP INDEX jobs_marker_missing_idx;
ALTER TABLE jobs DROP COLUMN marker_set_at;
