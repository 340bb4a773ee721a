package jobs

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/jobreaper/jobreaper/internal/idcheck"
	"github.com/jobreaper/jobreaper/internal/pgcore"
)

// claimSQL is the claim, its claimed event and the type's limits in one
// statement. The row is read under its lock first (prev), as the
// heartbeat reads it, so that a claim taking over a PROCESSING row records
// in its event what the database knows of the attempt it supersedes:
// generation, worker, runtime, idle time and longest progress gap at the
// takeover (nothing for a QUEUED row). The UPDATE repeats the fence on the
// row itself, and resets the attempt's longest progress gap.
const claimSQL = `
WITH prev AS (
    SELECT id, status, generation, worker, started_at, updated_at, max_idle_gap
      FROM {schema}.jobs WHERE id = @job_id
       FOR NO KEY UPDATE
), claimed AS (
    UPDATE {schema}.jobs j
       SET status = 'PROCESSING',
           generation = j.generation + 1,
           worker = @worker,
           started_at = now(),
           updated_at = now(),
           progress_mark = 0,
           failure_reason = NULL,
           ` + resetIdleGapSQL + `
      FROM prev
     WHERE j.id = prev.id
       AND j.generation = @expected_generation
       AND j.status IN ('QUEUED', 'PROCESSING')
 RETURNING j.id, j.generation, j.worker, j.type, coalesce(j.queue, '') AS queue, coalesce(j.parent_id, '') AS parent_id,
           coalesce(j.tenant_id, '') AS tenant_id, j."cursor", coalesce(j.total, 0) AS total, j.started_at, j.first_generation,
           ` + takeoverDetailSQL + ` AS detail
), event AS (
    INSERT INTO {schema}.job_events (job_id, kind, generation, worker, at, detail)
    SELECT id, 'claimed', generation, worker, now(), detail FROM claimed
)
SELECT c.id, c.generation, c.worker, c.type, c.queue, c.parent_id, c.tenant_id, c."cursor", c.total, c.started_at, c.first_generation,
       t.max_runtime, t.stall_timeout
  FROM claimed c LEFT JOIN {schema}.job_types t ON t.name = c.type`

// Claim starts an attempt of jobID: in one statement it moves a QUEUED or
// PROCESSING row whose generation is still expectedGeneration to PROCESSING,
// increments the generation, records worker, sets started_at and updated_at
// to the database's now(), resets the attempt's longest progress gap
// (jobs.max_idle_gap) to 0, and appends a "claimed" event. Of two claims of
// one generation exactly one wins. A claim that takes over a PROCESSING
// row (asynq ran the task again while the row still names an attempt)
// records in its event's detail what the row says of the superseded
// attempt at the takeover: previous_generation, previous_worker,
// previous_runtime_seconds, previous_idle_seconds and
// previous_max_idle_gap_seconds (a value the row does not hold is left
// out); a claim of a QUEUED row records {}. The same statement reads the type's
// max_runtime and stall_timeout into the lease (Lease.MaxRuntime,
// Lease.StallTimeout).
//
// It returns the new lease, or an error wrapping ErrClaimLost when the row
// matched nothing (another claim won, or the job is COMPLETED or FAILED), or
// a wrapped driver error when PostgreSQL failed; an error wrapping ErrBadID
// (nothing sent) for an ID no row can have (CheckID).
func (s *Store) Claim(ctx context.Context, jobID string, expectedGeneration int64, worker string) (Lease, error) {
	ctx, done := s.core.Op(ctx, "Claim")
	if err := idcheck.CheckID(jobID); err != nil {
		return Lease{}, done(err)
	}
	var (
		l             Lease
		maxRun, stall pgtype.Interval
	)
	err := s.core.DB().QueryRow(ctx, s.core.Q(claimSQL), pgx.NamedArgs{
		"job_id": jobID, "expected_generation": expectedGeneration, "worker": worker,
	}).Scan(&l.JobID, &l.Generation, &l.Worker, &l.Type, &l.Queue, &l.ParentID, &l.TenantID, &l.Cursor, &l.Total, &l.StartedAt, &l.FirstGeneration,
		&maxRun, &stall)
	if errors.Is(err, pgx.ErrNoRows) {
		return Lease{}, done(fmt.Errorf("job %s generation %d: %w", jobID, expectedGeneration, ErrClaimLost))
	}
	l.MaxRuntime, l.StallTimeout = leaseLimit(maxRun), leaseLimit(stall)
	return l, done(err)
}

// takeoverDetailSQL is the detail of a claimed event, over the claimed
// row's state before the claim as prev (status, generation, worker,
// started_at, updated_at, max_idle_gap, read under the row lock): for a
// claim that takes over a PROCESSING row, what the database knows of the
// attempt it supersedes at the takeover, each value left out when the row
// does not hold it (an infinite timestamp, which PostgreSQL cannot
// subtract, holds none); {} for a QUEUED row.
const takeoverDetailSQL = `CASE WHEN prev.status = 'PROCESSING' THEN jsonb_strip_nulls(jsonb_build_object(
               'previous_generation', prev.generation,
               'previous_worker', prev.worker,
               'previous_runtime_seconds', CASE WHEN isfinite(prev.started_at) THEN extract(epoch FROM now() - prev.started_at)::float8 END,
               'previous_idle_seconds', CASE WHEN isfinite(prev.updated_at) THEN extract(epoch FROM now() - prev.updated_at)::float8 END,
               'previous_max_idle_gap_seconds', extract(epoch FROM greatest(prev.max_idle_gap,
                   CASE WHEN isfinite(prev.updated_at) THEN now() - prev.updated_at END))::float8))
           ELSE '{}'::jsonb END`

// resetIdleGapSQL is the claim's SET item that starts the new attempt's
// longest progress gap.
const resetIdleGapSQL = `max_idle_gap = interval '0'`

// leaseLimit converts a job_types limit read by a claim for the lease: 0
// when NULL.
func leaseLimit(iv pgtype.Interval) time.Duration {
	if !iv.Valid {
		return 0
	}
	return pgcore.IntervalDuration(iv)
}
