-- +goose Up
-- suggest-limits and the status page read the events of a window by kind
-- (completed, failed, reaped, late_result_rejected of the last 7 days):
-- without this index each read scans every event ever kept.
CREATE INDEX job_events_kind_at_idx ON job_events (kind, at);

-- reaper_passes holds, per queue set, the record of the last pass its
-- leader ran: the summary, the jobs at risk and the pass's candidates. The
-- leader replaces its row after each pass (one upsert), so the status page
-- of every replica, a follower's too, shows what the leader saw. Every time
-- in it is the database clock's.
CREATE TABLE reaper_passes (
    -- The queue set, as leader_leases.key names it.
    key         text PRIMARY KEY,
    -- The daemon that ran the pass: its leader lease holder ID and host.
    holder_id   text NOT NULL,
    holder_host text NOT NULL,
    -- When the record was written (the pass's end).
    at          timestamptz NOT NULL DEFAULT now(),
    -- The pass's summary, as run --once --output json prints it.
    summary     jsonb NOT NULL,
    -- The jobs the pass found at risk (past max_runtime, idle at least half
    -- their stall timeout, not yet stalled) and its candidates (stalled
    -- jobs it tried to reap or held), each list at most 100 entries.
    at_risk     jsonb NOT NULL DEFAULT '[]',
    candidates  jsonb NOT NULL DEFAULT '[]'
);

-- +goose Down
DROP TABLE reaper_passes;
DROP INDEX job_events_kind_at_idx;
