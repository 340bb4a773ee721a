-- Least-privilege roles for jobreaper: one for the reaper daemon
-- (`jobreaper run`), one for the workers that link the library (the start
-- guard, heartbeats, Advance, Complete, Fail, and queue.Enqueue), and,
-- when operator_role is given, one for the operator commands (inspect,
-- requeue, cancel, prune, release-hold). Run it as the owner of jobreaper's
-- tables (the role that ran `jobreaper migrate`), after migrate, and again
-- after every migrate that adds a table:
--
--   psql "$DATABASE_URL" -v ON_ERROR_STOP=1 \
--        -v schema=jobreaper -v reaper_role=jobreaper_reaper -v worker_role=app_worker \
--        [-v operator_role=jobreaper_operator] -f deploy/sql/roles.sql
--
-- Role names are parameters because roles belong to the whole server, not
-- to one database: pick names no other database uses for something else.
-- A role that does not exist yet is created without a password and with
-- LOGIN; give it one (\password jobreaper_reaper) or map it in pg_hba.conf.
-- An existing role is left as it is and only gains the grants below.
--
-- No role may create, alter or drop anything: `jobreaper migrate` runs as
-- the owner. Every grant says which statement needs it.
--
-- What a cascade adds: the on_failed statements run in the reaper's
-- transaction (a reap), in the worker's (Fail, and the guard's failure
-- mapping) and in the operator's (cancel), the on_completed statements in
-- the worker's (Complete), the on_requeued statements in the operator's
-- (requeue).
-- Each role therefore needs, on the product's tables a cascade names,
-- exactly what the statements do, column by column, for example:
--
--   GRANT USAGE ON SCHEMA app TO jobreaper_reaper, app_worker;
--   GRANT SELECT (id, status, pending), UPDATE (status, failed_child, pending)
--         ON app.videos TO jobreaper_reaper, app_worker;
--
-- (UPDATE ... WHERE reads the columns it names, which needs SELECT on
-- them.) The reaper then still cannot write any other column of the
-- product's tables.

\set ON_ERROR_STOP 1

SELECT format('CREATE ROLE %I LOGIN', r)
  FROM unnest(ARRAY[:'reaper_role', :'worker_role']) AS r
 WHERE NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = r)
\gexec

-- Both: look up the tables by their qualified names, and the start-up
-- check (CheckMigrated, Store.CheckSchema) reads the migration record.
GRANT USAGE ON SCHEMA :"schema" TO :"reaper_role", :"worker_role";
GRANT SELECT ON :"schema".jobreaper_schema_version TO :"reaper_role", :"worker_role";
GRANT SELECT ON :"schema".job_types TO :"reaper_role", :"worker_role";

-- Reaper -----------------------------------------------------------------
-- The pass reads job rows (load, the lost-task scan, marker repair) and
-- locks the rows it reaps (SELECT ... FOR UPDATE, which needs an UPDATE
-- grant on some column).
GRANT SELECT ON :"schema".jobs TO :"reaper_role";
-- The reap: status FAILED, its reason and finish time, the marker not yet
-- written; after the marker write (and its repair), marker_set_at. A retry
-- reap (job_types.reap_retries): status QUEUED, the generation raised,
-- reap_count + 1, finished_at cleared.
GRANT UPDATE (status, failure_reason, finished_at, marker_set_at, generation, reap_count)
   ON :"schema".jobs TO :"reaper_role";
-- The reaped event of each reap (id is a bigserial).
GRANT INSERT (job_id, kind, generation, worker, detail) ON :"schema".job_events TO :"reaper_role";
-- Later passes recognise a retry-reaped QUEUED row by its latest reaped
-- event (a retry, at the generation below the row's).
GRANT SELECT (id, job_id, kind, generation, at, detail) ON :"schema".job_events TO :"reaper_role";
GRANT USAGE ON SEQUENCE :"schema".job_events_id_seq TO :"reaper_role";
-- The leader lease of its queue set: take or renew it (INSERT ... ON
-- CONFLICT DO UPDATE), check it before each reap's COMMIT (SELECT ... FOR
-- SHARE, which needs UPDATE too), release it on a clean exit (DELETE of its
-- own row).
GRANT SELECT, INSERT, UPDATE, DELETE ON :"schema".leader_leases TO :"reaper_role";
-- The outage grace: every pass reads the last outage end and records a new
-- one (INSERT ... ON CONFLICT DO UPDATE) after a restart, a failover or lost
-- connections.
GRANT SELECT, INSERT, UPDATE ON :"schema".reaper_outages TO :"reaper_role";

-- Stall-storm holds: every pass reads those of its queues, a pass that
-- would reap too many stalled jobs at once records one (id is a
-- bigserial), and the first pass after a hold's end records which queues
-- it reaped (drained). Never the release columns: ending a hold early is
-- an operator's act.
GRANT SELECT, INSERT (queues, types, held, judged, tripped, started_at, until),
      UPDATE (drained, drained_at)
   ON :"schema".reaper_holds TO :"reaper_role";
GRANT USAGE ON SEQUENCE :"schema".reaper_holds_id_seq TO :"reaper_role";
-- The status page and suggest-limits read the events of a window
-- (completed, failed, reaped, late_result_rejected) and the leader lease
-- rows; the leader records each pass (INSERT ... ON CONFLICT DO UPDATE of
-- its queue set's row) and every replica's status page reads them.
GRANT SELECT ON :"schema".job_events TO :"reaper_role";
GRANT SELECT, INSERT, UPDATE ON :"schema".reaper_passes TO :"reaper_role";

-- Worker -----------------------------------------------------------------
-- Reading the row (the guard, Enqueue, the outcome mapping, late-result
-- checks) and the batches a replayed Advance returns.
GRANT SELECT ON :"schema".jobs, :"schema".job_batches TO :"worker_role";
-- Inserting job rows (the product's enqueue side): the insert trigger
-- reads the ID's earlier generations from events, batches and past lives.
GRANT INSERT ON :"schema".jobs TO :"worker_role";
GRANT SELECT ON :"schema".job_events, :"schema".job_past_lives TO :"worker_role";
-- Claim, Heartbeat, Advance and SetTotal, Complete, Fail, Release, and the
-- outcome mapping: the attempt's columns, never type, queue, parent_id,
-- tenant_id, created_at, marker_set_at or first_generation (the trigger
-- sets that one). max_idle_gap is the attempt's longest progress gap,
-- kept by the claim, the heartbeat, Advance, Complete and Fail in their
-- own UPDATE: run this file again after the migration that adds it, or
-- those writes are refused.
GRANT UPDATE (status, generation, worker, started_at, updated_at, failure_reason,
              progress_mark, "cursor", total, finished_at, max_idle_gap)
   ON :"schema".jobs TO :"worker_role";
-- The claimed, failed, released and late_result_rejected events.
GRANT INSERT (job_id, kind, generation, worker, detail, at) ON :"schema".job_events TO :"worker_role";
GRANT USAGE ON SEQUENCE :"schema".job_events_id_seq TO :"worker_role";
-- Advance records each batch token (INSERT ... ON CONFLICT DO UPDATE over
-- an earlier life's row).
GRANT INSERT (job_id, token, generation, expected_cursor, count, cursor_after),
      UPDATE (generation, expected_cursor, count, cursor_after, at)
   ON :"schema".job_batches TO :"worker_role";

-- Operator ---------------------------------------------------------------
-- Only with -v operator_role=NAME; without it the operator commands run as
-- the owner, as before.
\if :{?operator_role}
SELECT format('CREATE ROLE %I LOGIN', :'operator_role')
 WHERE NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = :'operator_role')
\gexec
GRANT USAGE ON SCHEMA :"schema" TO :"operator_role";
GRANT SELECT ON :"schema".jobreaper_schema_version, :"schema".job_types TO :"operator_role";
-- suggest-limits reads the events of a window.
-- inspect, requeue and cancel read the job, its events and batch records;
-- prune reads the finished jobs whose history it deletes.
GRANT SELECT ON :"schema".jobs, :"schema".job_events, :"schema".job_batches TO :"operator_role";
-- cancel: locks the row (SELECT ... FOR UPDATE), fails it, and records
-- its marker; requeue: back to QUEUED with the generation raised, the
-- failure cleared and updated_at moved. Never type, queue, parent_id,
-- tenant_id, "cursor", total or the attempt's worker and start.
GRANT UPDATE (status, generation, failure_reason, finished_at, marker_set_at, updated_at)
   ON :"schema".jobs TO :"operator_role";
-- The cancelled and requeued events.
GRANT INSERT (job_id, kind, generation, worker, detail) ON :"schema".job_events TO :"operator_role";
GRANT USAGE ON SEQUENCE :"schema".job_events_id_seq TO :"operator_role";
-- prune: deletes finished jobs' events and batch records, and records the
-- run in prune_runs.
GRANT DELETE ON :"schema".job_events, :"schema".job_batches TO :"operator_role";
GRANT INSERT (older_than, cutoff, events, batches, complete, operator) ON :"schema".prune_runs TO :"operator_role";
GRANT USAGE ON SEQUENCE :"schema".prune_runs_id_seq TO :"operator_role";

-- release-hold: ends the stall-storm holds in effect (UPDATE ... WHERE
-- reads queues, until, released_at and drained_at, and RETURNING reads the
-- row) and records who and why.
GRANT SELECT, UPDATE (released_at, released_by, reason) ON :"schema".reaper_holds TO :"operator_role";
\endif

-- Not granted, on purpose: DELETE on any other table (a product that deletes
-- job rows needs DELETE on jobs, and the delete trigger then needs INSERT
-- and UPDATE on job_past_lives: grant those to the role that deletes);
-- TRUNCATE; any write to job_types (registering a type is a deploy step,
-- run as the owner).
