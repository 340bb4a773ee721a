-- +goose Up
-- Marker re-assertion walks every job reaped within the marker's 7 days by
-- the keyset (finished_at, id), a slice per pass; failure reasons that
-- write a marker only.
CREATE INDEX jobs_reaped_window_idx ON jobs (finished_at, id)
    WHERE status = 'FAILED' AND failure_reason IN ('stalled', 'lost_task', 'cancelled');
-- The stale QUEUED report walks QUEUED rows by the keyset (updated_at, id),
-- a page per pass; the age bound ends the range.
CREATE INDEX jobs_queued_updated_idx ON jobs (updated_at, id) WHERE status = 'QUEUED';

-- +goose Down
DROP INDEX jobs_queued_updated_idx;
DROP INDEX jobs_reaped_window_idx;
