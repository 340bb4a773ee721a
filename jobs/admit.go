package jobs

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// AdmitOutcome says what Admit did with a job.
type AdmitOutcome int

// The outcomes of Admit, in the order its rules are applied to the row as
// it stands after any lock wait.
const (
	// AdmitNoRow: no row has the ID (yet, or any more).
	AdmitNoRow AdmitOutcome = iota + 1
	// AdmitCompleted: the row is COMPLETED; nothing was written.
	AdmitCompleted
	// AdmitFailed: the row is FAILED; nothing was written. The failure
	// reason says whether it was reaped.
	AdmitFailed
	// AdmitMarked: the given marker generation is at or above the row's
	// generation (a reap of this attempt or a later one); nothing written.
	AdmitMarked
	// AdmitHeld: the caller asked for no claim (Admission.Claim false) and
	// the row is QUEUED or PROCESSING; nothing was written.
	AdmitHeld
	// AdmitLost: the row's generation moved between the statement's
	// snapshot and its lock (another claim of the same generation won);
	// nothing was written.
	AdmitLost
	// AdmitClaimed: the claim won; Admission.Lease is the new attempt.
	AdmitClaimed
)

// AdmitRequest is what the start guard knows before it asks PostgreSQL.
type AdmitRequest struct {
	// JobID is the task's ID.
	JobID string
	// Worker is recorded by a claim.
	Worker string
	// Marker is the generation the job's Redis marker records; HasMarker
	// is false when there is no marker.
	Marker    int64
	HasMarker bool
	// Claim false asks only for the row's verdict (COMPLETED, FAILED, no
	// row) without claiming, for a guard that could not read the marker.
	Claim bool
}

// Admission is Admit's answer.
type Admission struct {
	Outcome AdmitOutcome
	// Status, Generation and FailureReason ("" when NULL) are the row the
	// decision was made on: as it stood after any lock wait, before the
	// claim. Zero for AdmitNoRow.
	Status        string
	Generation    int64
	FailureReason string
	// Lease is the new attempt, for AdmitClaimed only.
	Lease Lease
}

// admitSQL is the start guard's one statement. snap reads the generation
// under the statement's snapshot: the generation a claim is for. cur locks
// the row and, under READ COMMITTED, reads it as it stands after waiting
// for any concurrent writer; every decision is made on cur. The claim
// changes the row only when cur still holds snap's generation, so of two
// statements that saw one generation exactly one claims; the other finds
// a moved generation and claims nothing.
const admitSQL = `
WITH snap AS (
    SELECT generation FROM {schema}.jobs WHERE id = @job_id
), cur AS (
    SELECT id, status, generation, coalesce(failure_reason, '') AS failure_reason,
           worker, started_at, updated_at, max_idle_gap
      FROM {schema}.jobs WHERE id = @job_id
       FOR NO KEY UPDATE
), prev AS (
    SELECT * FROM cur
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
      FROM cur, snap, prev
     WHERE j.id = cur.id
       AND @claim::boolean
       AND cur.generation = snap.generation
       AND cur.status IN ('QUEUED', 'PROCESSING')
       AND (@marker::bigint IS NULL OR @marker::bigint < cur.generation)
 RETURNING j.id, j.generation, j.worker, j.type, coalesce(j.queue, '') AS queue,
           coalesce(j.parent_id, '') AS parent_id, coalesce(j.tenant_id, '') AS tenant_id,
           j."cursor", coalesce(j.total, 0) AS total, j.started_at, j.first_generation,
           ` + takeoverDetailSQL + ` AS detail
), event AS (
    INSERT INTO {schema}.job_events (job_id, kind, generation, worker, at, detail)
    SELECT id, 'claimed', generation, worker, now(), detail FROM claimed
)
SELECT cur.status, cur.generation, cur.failure_reason, snap.generation,
       c.id, c.generation, c.worker, c.type, c.queue, c.parent_id, c.tenant_id,
       c."cursor", c.total, c.started_at, c.first_generation, t.max_runtime, t.stall_timeout
  FROM cur LEFT JOIN snap ON true LEFT JOIN claimed c ON true
       LEFT JOIN {schema}.job_types t ON t.name = c.type`

// Admit is the start guard's read and claim in one statement (one round
// trip). On the row as it stands after any lock wait it answers, in order:
// no row (AdmitNoRow); COMPLETED (AdmitCompleted) or FAILED (AdmitFailed),
// writing nothing; with req.HasMarker, a marker generation at or above the
// row's (AdmitMarked: a marker of an earlier life of the ID is below every
// generation of the current life, see docs/schema.md, "A job ID's lives", so it
// does not refuse); with !req.Claim, AdmitHeld. Otherwise it claims as
// Claim does (generation+1, worker, started_at = updated_at = now(),
// PROCESSING, a "claimed" event in the same statement, the type's
// max_runtime and stall_timeout read into the lease), provided the
// generation is the one the statement's snapshot saw: of two Admits that
// saw one generation exactly one returns AdmitClaimed and the other
// AdmitLost.
//
// It returns a wrapped driver error when PostgreSQL fails; nothing was
// claimed then, unless the failure hid a committed claim's answer.
func (s *Store) Admit(ctx context.Context, req AdmitRequest) (Admission, error) {
	ctx, done := s.core.Op(ctx, "Admit")
	var marker *int64
	if req.HasMarker {
		marker = &req.Marker
	}
	var (
		a                             Admission
		snapGen                       *int64
		cid, cworker, ctype           *string
		cqueue, cparent, ctenant      *string
		cgen, ccursor, ctotal, cfirst *int64
		cstarted                      pgtype.Timestamptz
		maxRun, stall                 pgtype.Interval
	)
	// A row replaced by a new life of the ID while cur waited for its lock
	// reads as no row; lockedRead asks once more, and the new statement
	// admits the new life as a later delivery would.
	err := lockedRead(func() error {
		return s.core.DB().QueryRow(ctx, s.core.Q(admitSQL), pgx.NamedArgs{
			"job_id": req.JobID, "worker": req.Worker, "marker": marker, "claim": req.Claim,
		}).Scan(&a.Status, &a.Generation, &a.FailureReason, &snapGen,
			&cid, &cgen, &cworker, &ctype, &cqueue, &cparent, &ctenant, &ccursor, &ctotal, &cstarted, &cfirst, &maxRun, &stall)
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return Admission{Outcome: AdmitNoRow}, done(nil)
	}
	if err != nil {
		return Admission{}, done(fmt.Errorf("job %s: %w", req.JobID, err))
	}
	switch {
	case cid != nil:
		a.Outcome = AdmitClaimed
		a.Lease = Lease{JobID: *cid, Generation: *cgen, Worker: *cworker, Type: *ctype, Queue: *cqueue,
			ParentID: *cparent, TenantID: *ctenant, Cursor: *ccursor, Total: *ctotal,
			StartedAt: cstarted.Time, FirstGeneration: *cfirst,
			MaxRuntime: leaseLimit(maxRun), StallTimeout: leaseLimit(stall)}
	case a.Status == StatusCompleted:
		a.Outcome = AdmitCompleted
	case a.Status == StatusFailed:
		a.Outcome = AdmitFailed
	case req.HasMarker && req.Marker >= a.Generation:
		a.Outcome = AdmitMarked
	case !req.Claim:
		a.Outcome = AdmitHeld
	default:
		// QUEUED or PROCESSING, no refusing marker, claim asked: only a
		// generation that moved after the snapshot stops the claim.
		a.Outcome = AdmitLost
	}
	return a, done(nil)
}
