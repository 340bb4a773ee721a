-- +goose Up
-- leader_leases holds one leader lease per queue set: the row that lets one
-- reaper daemon of the set run passes while the others wait. Every time in
-- it is the database clock's (clock_timestamp()), so replicas never compare
-- their own clocks.
CREATE TABLE leader_leases (
    -- The daemon's queue set, normalized: its --queues list sorted, without
    -- duplicates, as a JSON array ('[]' means every queue).
    key               text PRIMARY KEY,
    -- The holder's identity: a random ID per daemon process, and, for
    -- people, its host, process ID and start time.
    holder_id         text NOT NULL,
    holder_host       text NOT NULL,
    holder_pid        integer NOT NULL,
    holder_started_at timestamptz NOT NULL,
    -- When the holder took the leader lease, and last renewed it.
    acquired_at       timestamptz NOT NULL,
    renewed_at        timestamptz NOT NULL,
    -- The leader lease is valid while clock_timestamp() < expires_at.
    expires_at        timestamptz NOT NULL,
    -- The settings that decide a reap, as the holder runs them: every
    -- replica of the set compares its own with them (settings drift).
    settings          jsonb NOT NULL DEFAULT '{}'
);

-- Marker repair also re-sets the markers of cancelled jobs (jobreaper
-- cancel), so its partial index covers that code too.
CREATE INDEX jobs_marker_missing_all_idx ON jobs (finished_at)
    WHERE status = 'FAILED' AND marker_set_at IS NULL AND failure_reason IN ('stalled', 'lost_task', 'cancelled');

-- +goose Down
DROP INDEX jobs_marker_missing_all_idx;
DROP TABLE leader_leases;
