package jobs

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
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
SELECT * FROM claimed`

// Claim starts an attempt of jobID: in one statement it moves a QUEUED or
// PROCESSING row whose generation is still expectedGeneration to PROCESSING,
// increments the generation, records worker, sets started_at and updated_at
// to the database's now(), and appends a "claimed" event. Of two claims of
// one generation exactly one wins.
//
// It returns the new lease, or an error wrapping ErrClaimLost when the row
// matched nothing (another claim won, or the job is COMPLETED or FAILED), or
// a wrapped driver error when PostgreSQL failed; an error wrapping ErrBadID
// (nothing sent) for an ID no row can have (CheckID).
func (s *Store) Claim(ctx context.Context, jobID string, expectedGeneration int64, worker string) (Lease, error) {
	ctx, done := s.op(ctx, "Claim")
	if err := CheckID(jobID); err != nil {
		return Lease{}, done(err)
	}
	var l Lease
	err := s.db.QueryRow(ctx, s.q(claimSQL), pgx.NamedArgs{
		"job_id": jobID, "expected_generation": expectedGeneration, "worker": worker,
	}).Scan(&l.JobID, &l.Generation, &l.Worker, &l.Type, &l.Queue, &l.ParentID, &l.TenantID, &l.Cursor, &l.Total, &l.StartedAt, &l.FirstGeneration)
	if errors.Is(err, pgx.ErrNoRows) {
		return Lease{}, done(fmt.Errorf("job %s generation %d: %w", jobID, expectedGeneration, ErrClaimLost))
	}
	return l, done(err)
}
