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

const claimSQL = `
WITH claimed AS (
    UPDATE {schema}.jobs
       SET status = 'PROCESSING',
           generation = generation + 1,
           worker = @worker,
           started_at = now(),
           updated_at = now(),
           progress_mark = 0,
           failure_reason = NULL
     WHERE id = @job_id
       AND generation = @expected_generation
       AND status IN ('QUEUED', 'PROCESSING')
 RETURNING id, generation, worker, type, coalesce(queue, ''), coalesce(parent_id, ''),
           coalesce(tenant_id, ''), "cursor", coalesce(total, 0), started_at, first_generation
), event AS (
    INSERT INTO {schema}.job_events (job_id, kind, generation, worker, at)
    SELECT id, 'claimed', generation, worker, now() FROM claimed
)
SELECT c.*, t.max_runtime, t.stall_timeout
  FROM claimed c LEFT JOIN {schema}.job_types t ON t.name = c.type`

// Claim starts an attempt of jobID: in one statement it moves a QUEUED or
// PROCESSING row whose generation is still expectedGeneration to PROCESSING,
// increments the generation, records worker, sets started_at and updated_at
// to the database's now(), and appends a "claimed" event. Of two claims of
// one generation exactly one wins. The same statement reads the type's
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

// leaseLimit converts a job_types limit read by a claim for the lease: 0
// when NULL.
func leaseLimit(iv pgtype.Interval) time.Duration {
	if !iv.Valid {
		return 0
	}
	return pgcore.IntervalDuration(iv)
}
