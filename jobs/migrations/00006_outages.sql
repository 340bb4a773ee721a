-- +goose Up
-- reaper_outages holds, per database, the end of the last PostgreSQL outage
-- the reaper daemons know of. A job's idle time never counts across an
-- outage: the stall rule measures it from the later of the job's updated_at
-- and outage_end, since a live worker could not write a heartbeat while
-- PostgreSQL was unreachable. It is a row, not a daemon's memory, so that
-- every replica, a newly elected leader and a manual `jobreaper run --once`
-- apply the same value. Every time in it is the database clock's.
CREATE TABLE reaper_outages (
    -- current_database(): one row per database.
    database         text PRIMARY KEY,
    -- The end of the last outage.
    outage_end       timestamptz NOT NULL,
    -- Why outage_end was last moved: first_record (no row before: the
    -- postmaster start), connection_lost (a daemon's first good statement
    -- after connection-level failures), restart (a later postmaster start),
    -- timeline_change (a promotion after a failover) or server_change (an
    -- earlier postmaster start: another server answers).
    cause            text NOT NULL,
    -- pg_control_checkpoint().timeline_id as last seen; NULL while no
    -- daemon may read it (a managed service can revoke the function).
    timeline         bigint,
    -- pg_postmaster_start_time() as last seen.
    postmaster_start timestamptz NOT NULL,
    -- Who moved outage_end last (host:pid of the daemon or run --once),
    -- and when.
    recorded_by      text NOT NULL,
    recorded_at      timestamptz NOT NULL
);

-- +goose Down
DROP TABLE reaper_outages;
