-- +goose Up
-- max_idle_gap is the current attempt's longest progress gap: the longest
-- time between two recorded writes of the attempt (its claim, a heartbeat
-- that moved updated_at, an Advance) or between the last of them and the
-- attempt's end (Complete, Fail, a reap). Each of those writes keeps it in
-- the statement that moves updated_at or ends the attempt, as
-- greatest(max_idle_gap, now() - updated_at), so the evidence costs no
-- statement of its own; the claim resets it to 0. It is measured between
-- recorded writes, not between calls: the heartbeat limiter writes at most
-- once per interval, so a gap of a job that heartbeats is at least about
-- one interval. NULL: the row was not claimed since this column exists.
ALTER TABLE jobs ADD COLUMN max_idle_gap interval;

-- +goose Down
ALTER TABLE jobs DROP COLUMN max_idle_gap;
