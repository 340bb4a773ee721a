package pgstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/jobreaper/jobreaper/internal/idcheck"
	"github.com/jobreaper/jobreaper/internal/pgcore"
)

// ErrChangedSinceRead means a compare-and-set found the job no longer in
// the state the caller read (another status or generation): nothing was
// written. Read the job again before deciding anew.
var ErrChangedSinceRead = errors.New("job changed since it was read")

// EventRequeued is the kind of the job_events row Requeue writes.
const EventRequeued = "requeued"

// requeueSQL puts a FAILED or QUEUED job back to QUEUED with its generation
// raised, if it is still in the status and generation that were read.
// Raising the generation is what lets the start guard run the job again:
// the marker of a reap records the reaped generation, and the guard refuses
// a task whose marker holds the row's generation or a newer one. The cursor
// stays, so the next attempt resumes where the last one stopped; updated_at
// moves, so the job is not reported as stale QUEUED again at once.
// The status is compared under COLLATE "C" (the same answer for these
// ASCII words) so that the statement never matches the predicate of the
// partial index jobs_failed_finished_idx: on stale statistics the planner
// would read that index with the ID as a mere filter instead of the
// primary key (see StallPredicate; TestWorkerPlansHoldOnStaleStatistics).
const requeueSQL = `
UPDATE {schema}.jobs
   SET status = 'QUEUED', generation = generation + 1, failure_reason = NULL, finished_at = NULL,
       marker_set_at = NULL, updated_at = now()
 WHERE id = @id AND status COLLATE "C" = @status AND generation = @generation AND status COLLATE "C" IN ('FAILED', 'QUEUED')
RETURNING generation, type, coalesce(parent_id, ''), coalesce(tenant_id, '')`

// RequeueParams names a job to requeue and the state it was read in.
type RequeueParams struct {
	JobID string
	// Status and Generation are the values read; Requeue changes nothing
	// when either moved since. Status must be StatusFailed or StatusQueued.
	Status     string
	Generation int64
	// Reason is the operator's words, recorded in the event.
	Reason string
	// Detail is added to the event's detail (what the caller found in
	// asynq, for example); it must marshal to a JSON object.
	Detail map[string]any
}

// Requeue puts a FAILED or QUEUED job back to QUEUED with its generation
// raised by one, failure_reason, finished_at and marker_set_at cleared,
// records a "requeued" event carrying p.Reason and p.Detail, and runs the
// type's on_requeued cascade (WithCascades), in one transaction: the
// product's own status of the job is reset with the row, or neither is.
// It returns the new generation.
//
// Errors: pgcore.ErrInvalidArgument for an empty reason or a status other than
// FAILED or QUEUED (nothing sent); ErrChangedSinceRead when the row is no
// longer in p.Status at p.Generation (nothing written; a missing row
// answers the same); ErrBadID for an ID no row can have (CheckID, nothing
// sent); pgcore.ErrTxEnded when a cascade statement ended the transaction; a
// wrapped cascade or driver error otherwise (nothing written).
func (s *Store) Requeue(ctx context.Context, p RequeueParams) (int64, error) {
	if err := idcheck.CheckID(p.JobID); err != nil {
		return 0, fmt.Errorf("jobs.Requeue: %w", err)
	}
	if p.Reason == "" {
		return 0, fmt.Errorf("jobs.Requeue: job %s: %w: a reason is required", p.JobID, pgcore.ErrInvalidArgument)
	}
	if p.Status != StatusFailed && p.Status != StatusQueued {
		return 0, fmt.Errorf("jobs.Requeue: job %s: %w: status %s cannot be requeued", p.JobID, pgcore.ErrInvalidArgument, p.Status)
	}
	detail := map[string]any{}
	for k, v := range p.Detail {
		detail[k] = v
	}
	detail["reason"], detail["from_status"], detail["from_generation"] = p.Reason, p.Status, p.Generation
	js, err := json.Marshal(detail)
	if err != nil {
		return 0, fmt.Errorf("jobs.Requeue: job %s: %w: detail: %v", p.JobID, pgcore.ErrInvalidArgument, err)
	}
	ctx, done := s.core.Op(ctx, "Requeue")
	var gen int64
	err = s.core.InTx(ctx, func(tx pgx.Tx) error {
		ca := pgcore.CascadeArgs{JobID: p.JobID}
		err := tx.QueryRow(ctx, s.core.Q(requeueSQL), pgx.NamedArgs{"id": p.JobID, "status": p.Status, "generation": p.Generation}).
			Scan(&gen, &ca.Type, &ca.ParentID, &ca.TenantID)
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("job %s is no longer %s at generation %d: %w", p.JobID, p.Status, p.Generation, ErrChangedSinceRead)
		}
		if err != nil {
			return err
		}
		_, err = tx.Exec(ctx, s.core.Q(`INSERT INTO {schema}.job_events (job_id, kind, generation, detail) VALUES ($1, $2, $3, $4)`),
			p.JobID, EventRequeued, gen, pgcore.JSONText(js))
		if err != nil {
			return err
		}
		return s.core.RunRequeued(ctx, tx, ca)
	})
	if err != nil {
		return 0, done(err)
	}
	return gen, done(nil)
}
