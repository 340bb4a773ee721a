-- +goose Up
-- reaper_holds records stall-storm holds. A pass that would reap more
-- stalled jobs than max_stalled_per_pass, or more than max_stalled_fraction
-- of the active tasks it judged, reaps none of them and records a hold on
-- their queues instead: until it ends, every replica and run --once skip
-- the stalled jobs of those queues (stall_storm_held), so that workers cut
-- off from PostgreSQL for a while are not all failed at once. The first
-- pass after the hold ends, or is released by an operator (jobreaper
-- release-hold), reaps every job still stalled in those queues without
-- the storm check, and records the queues it did that for in drained.
-- Every time in it is the database clock's.
CREATE TABLE reaper_holds (
    id          bigserial PRIMARY KEY,
    -- The queues held, sorted, each once; a job whose row names no queue
    -- counts in asynq's default queue, where its task runs.
    queues      text[] NOT NULL CHECK (cardinality(queues) > 0),
    -- The job types of the stalled jobs held at the start, sorted.
    types       text[] NOT NULL,
    -- The stalled jobs held at the start, and the active tasks of the
    -- held queues the starting pass judged.
    held        integer NOT NULL,
    judged      integer NOT NULL,
    -- The limit that tripped, as a sentence with its values.
    tripped     text NOT NULL,
    started_at  timestamptz NOT NULL DEFAULT now(),
    -- The hold is in effect while now() < until and released_at is NULL.
    until       timestamptz NOT NULL CHECK (until >= started_at),
    -- Set by jobreaper release-hold: when, who (user@host) and why.
    released_at timestamptz,
    released_by text,
    reason      text,
    -- The queues whose first pass after the hold's end has reaped them
    -- without the storm check; drained_at is set once every queue of the
    -- hold is among them, and a drained hold is never read again.
    drained     text[] NOT NULL DEFAULT '{}',
    drained_at  timestamptz
);

-- Every pass reads the holds not drained yet (a handful at most).
CREATE INDEX reaper_holds_open_idx ON reaper_holds (until) WHERE drained_at IS NULL;

-- +goose Down
DROP TABLE reaper_holds;
