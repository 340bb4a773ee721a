package jobs

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/jobreaper/jobreaper/internal/pgcore"
)

// This file holds the writes the start guard's outcome mapping needs
// besides Fail: handing an attempt back for asynq's retry, and completing
// a job whose handler returned success without calling Complete.

const releaseSQL = `
UPDATE {schema}.jobs SET status = 'QUEUED'
 WHERE id = @job_id AND status = 'PROCESSING' AND generation = @generation`

// Release hands lease's job back to the queue after an error asynq will
// retry: a fenced UPDATE (status PROCESSING, the lease's generation) to
// QUEUED that keeps the cursor, so the next claim resumes where this attempt
// stopped, and appends a "released" event in the same transaction. The
// generation is kept; the next claim increments it, which fences anything
// this attempt still writes.
//
// Tries are repeated as Fail's are (a connection-level failure, a deadlock
// or a serialization failure: six tries at most over 7.75 s of backoff,
// until ctx ends); a job a retry finds QUEUED at the lease's generation
// after a COMMIT whose answer was lost was released by this call.
//
// Errors: ErrStaleWorker when another generation owns the job (or it was
// released already), ErrJobTerminal when it is COMPLETED or FAILED, both
// with a late_result_rejected event; ErrNotFound for a missing row;
// otherwise the last try's wrapped driver error or timeout.
func (s *Store) Release(ctx context.Context, lease Lease) error {
	return s.retryFinal(ctx, func(ctx context.Context, maybeDone bool) error {
		return s.releaseOnce(ctx, lease, maybeDone)
	})
}

// releaseOnce is one try of Release.
func (s *Store) releaseOnce(ctx context.Context, lease Lease, maybeDone bool) error {
	ctx, done := s.core.Op(ctx, "Release")
	matched := false
	err := s.core.InTx(ctx, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, s.core.Q(releaseSQL), namedLease(lease))
		if err != nil || tag.RowsAffected() == 0 {
			return err
		}
		matched = true
		return s.appendEvent(ctx, tx, EventReleased, lease, nil)
	})
	if err != nil || matched {
		return done(err)
	}
	own := func(st jobState) bool {
		return maybeDone && st.Status == StatusQueued && st.Generation == lease.Generation
	}
	return done(s.refuseFinal(ctx, "Release", lease, own))
}

// refuseFinal answers a finalization write (op) of lease that matched no
// row, reading the row through the Store's handle: nil when own says the
// row is as this very call left it (an earlier try's COMMIT whose answer
// was lost); the typed refusal, with its late_result_rejected event, when
// the attempt is stale or the job terminal; an error saying so when the
// row still reads PROCESSING at the lease's generation.
func (s *Store) refuseFinal(ctx context.Context, op string, lease Lease, own func(jobState) bool) error {
	st, err := s.readState(ctx, s.core.DB(), lease.JobID)
	if err != nil {
		return err
	}
	if own(st) {
		return nil
	}
	if ferr := fenceError(lease, st); ferr != nil {
		return s.rejectLate(ctx, op, lease, st, ferr)
	}
	return fmt.Errorf("job %s matched no row although it reads PROCESSING at generation %d", lease.JobID, st.Generation)
}

const autoCompleteSQL = `
UPDATE {schema}.jobs j SET status = 'COMPLETED', finished_at = now(), ` + keepIdleGapSQL + `
  FROM {schema}.job_types t
 WHERE j.id = @job_id AND j.status = 'PROCESSING' AND j.generation = @generation
   AND t.name = j.type AND t.auto_complete
RETURNING j.type, coalesce(j.parent_id, ''), coalesce(j.tenant_id, ''), ` + attemptEvidenceSQL

const autoStateSQL = `
SELECT j.status, j.generation, coalesce(j.failure_reason, ''), coalesce(t.auto_complete, false)
  FROM {schema}.jobs j LEFT JOIN {schema}.job_types t ON t.name = j.type
 WHERE j.id = $1`

// AutoComplete settles a handler that returned success: it completes
// lease's job when its type is marked auto_complete, in one transaction with
// a "completed" event (auto_complete, runtime_seconds and
// max_idle_gap_seconds in its detail) and the on_completed cascade, as
// Complete does. The
// UPDATE re-checks the type's auto_complete flag and the fence (status
// PROCESSING, the lease's generation) in SQL.
//
// A job the handler already completed (COMPLETED by this generation) returns
// Replayed, whatever its type, so the middleware may call AutoComplete after
// every successful handler. A job of a type that is not auto-complete gets
// ErrNotAutoComplete and nothing is written: the middleware then calls Fail
// with ReasonNoCompletion.
//
// Tries are repeated as Fail's are (a connection-level failure, a
// deadlock or a serialization failure: six tries at most over 7.75 s of
// backoff, until ctx ends); a retry after a COMMIT whose answer was lost
// finds the job COMPLETED by this generation and returns Replayed.
//
// Errors: ErrNotAutoComplete as above; ErrStaleWorker or ErrJobTerminal
// when the attempt is over, with a late_result_rejected event; ErrNotFound
// for a missing row; a wrapped cascade error; ErrTxEnded when a cascade
// statement ended the transaction; otherwise the last try's wrapped driver
// error or timeout.
func (s *Store) AutoComplete(ctx context.Context, lease Lease) (CompleteResult, error) {
	var res CompleteResult
	err := s.retryFinal(ctx, func(ctx context.Context, _ bool) error {
		var err error
		res, err = s.autoCompleteOnce(ctx, lease)
		return err
	})
	return res, err
}

// autoCompleteOnce is one try of AutoComplete.
func (s *Store) autoCompleteOnce(ctx context.Context, lease Lease) (CompleteResult, error) {
	ctx, done := s.core.Op(ctx, "AutoComplete")
	matched := false
	var fin finishedAttempt
	err := s.core.InTx(ctx, func(tx pgx.Tx) error {
		var (
			ca pgcore.CascadeArgs
			ev attemptEvidence
		)
		err := tx.QueryRow(ctx, s.core.Q(autoCompleteSQL), namedLease(lease)).
			Scan(&ca.Type, &ca.ParentID, &ca.TenantID, &ev.RuntimeSeconds, &ev.MaxIdleGapSeconds)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		if err != nil {
			return err
		}
		matched = true
		fin = finishedAttempt{typ: ca.Type, outcome: outcomeCompleted, ev: ev}
		detail, err := ev.detail(map[string]any{"auto_complete": true})
		if err != nil {
			return err
		}
		if err := s.appendEvent(ctx, tx, EventCompleted, lease, detail); err != nil {
			return err
		}
		ca.JobID = lease.JobID
		return s.core.RunCompleted(ctx, tx, ca)
	})
	if err != nil {
		return CompleteResult{}, done(err)
	}
	if matched {
		s.metrics.finished(fin)
		return CompleteResult{Confirmed: true}, done(nil)
	}
	var (
		st   jobState
		auto bool
	)
	err = s.core.DB().QueryRow(ctx, s.core.Q(autoStateSQL), lease.JobID).Scan(&st.Status, &st.Generation, &st.FailureReason, &auto)
	if errors.Is(err, pgx.ErrNoRows) {
		return CompleteResult{}, done(fmt.Errorf("job %s: %w", lease.JobID, ErrNotFound))
	}
	if err != nil {
		return CompleteResult{}, done(err)
	}
	if st.Status == StatusCompleted && st.Generation == lease.Generation {
		return CompleteResult{Replayed: true, Confirmed: true}, done(nil)
	}
	if ferr := fenceError(lease, st); ferr != nil {
		return CompleteResult{}, done(s.rejectLate(ctx, "AutoComplete", lease, st, ferr))
	}
	if !auto {
		return CompleteResult{}, done(fmt.Errorf("job %s: %w", lease.JobID, ErrNotAutoComplete))
	}
	return CompleteResult{}, done(fmt.Errorf("job %s matched no row although it reads PROCESSING at generation %d", lease.JobID, st.Generation))
}
