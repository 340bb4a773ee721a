package jobs

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/jobreaper/jobreaper/internal/pgcore"
)

// TxBeginner starts transactions: *pgxpool.Pool, *pgx.Conn and pgx.Tx (a
// savepoint) satisfy it.
type TxBeginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// CompleteResult is the outcome of a successful completion.
type CompleteResult struct {
	// Replayed: the job was already COMPLETED by this generation, so this
	// is a retry after a lost commit acknowledgement. Nothing was written,
	// the on_completed cascade did not run again, and the caller must not
	// write the completion's product rows again.
	Replayed bool
	// Confirmed: the completion is committed. Complete leaves it false
	// unless Replayed (the caller still has to commit its transaction);
	// CompleteWith and AutoComplete set it once their transaction committed.
	Confirmed bool
}

// completeSQL ends the attempt as COMPLETED, keeping its longest progress
// gap (keepIdleGapSQL), and returns what the cascade and the completed
// event need (attemptEvidenceSQL).
const completeSQL = `
UPDATE {schema}.jobs j SET status = 'COMPLETED', finished_at = now(), ` + keepIdleGapSQL + `
 WHERE j.id = @job_id AND j.status = 'PROCESSING' AND j.generation = @generation
RETURNING j.type, coalesce(j.parent_id, ''), coalesce(j.tenant_id, ''), ` + attemptEvidenceSQL

// Complete marks lease's job COMPLETED in the caller's transaction tx. It
// must be the first write of tx: the completion's product rows, READY flags
// and usage charges are written after it in tx, so that a refused
// completion is known before any of them exists. In the same tx it appends a
// "completed" event, whose detail holds the attempt's runtime_seconds and
// max_idle_gap_seconds (its longest progress gap, which the same UPDATE
// keeps), and runs the type's on_completed cascade. The attempt's runtime
// is observed in jobreaper_job_runtime_seconds (WithRegisterer) when the
// UPDATE matched, whether or not the caller then commits tx.
//
// The UPDATE is fenced (status PROCESSING, the lease's generation). When it
// matches nothing the row is re-read: COMPLETED by this generation returns
// Replayed (a lost commit acknowledgement; the cascade does not run again).
//
// Errors (tx must then be rolled back; none of the caller's rows may be
// written): ErrJobTerminal when the job is FAILED at the lease's generation
// (reaped or failed); ErrStaleWorker when another generation owns the job (a
// newer attempt claimed or completed it) or this attempt released it; both
// record a late_result_rejected event outside tx. ErrNotFound for a missing
// row; a wrapped cascade error naming the type and statement; ErrTxEnded
// when an on_completed statement ended tx (a COMMIT or ROLLBACK that slipped
// past PrepareCascades); otherwise a wrapped driver error or the
// operation's timeout.
func (s *Store) Complete(ctx context.Context, tx pgx.Tx, lease Lease) (CompleteResult, error) {
	res, fin, late, err := s.complete(ctx, tx, lease)
	if late != nil {
		return res, late.record(ctx, s)
	}
	if err == nil && !res.Replayed {
		s.metrics.finished(fin)
	}
	return res, err
}

// lateWrite is a refused write whose late_result_rejected event is still
// to be recorded: CompleteWith rolls its transaction back first, so that
// the event's connection is never asked for while the attempt still holds
// one (a pool that every late completion holds a connection of would
// otherwise wait out the operation timeout and lose the events).
type lateWrite struct {
	op      string
	lease   Lease
	st      jobState
	refusal error
}

// record writes w's event (rejectLate) and returns the refusal.
func (w *lateWrite) record(ctx context.Context, s *Store) error {
	return s.rejectLate(ctx, w.op, w.lease, w.st, w.refusal)
}

// finishedAttempt is an attempt a final write ended, for
// jobreaper_job_runtime_seconds.
type finishedAttempt struct {
	typ, outcome string
	ev           attemptEvidence
}

// complete is Complete without the runtime observation (CompleteWith
// observes it once its transaction committed) and with the event of a
// refused completion left to the caller: late is non-nil when the
// completion was refused as stale or terminal, and then err is nil and the
// caller must call late.record.
func (s *Store) complete(ctx context.Context, tx pgx.Tx, lease Lease) (_ CompleteResult, _ finishedAttempt, late *lateWrite, _ error) {
	ctx, done := s.core.Op(ctx, "Complete")
	var (
		ca pgcore.CascadeArgs
		ev attemptEvidence
	)
	err := tx.QueryRow(ctx, s.core.Q(completeSQL), namedLease(lease)).
		Scan(&ca.Type, &ca.ParentID, &ca.TenantID, &ev.RuntimeSeconds, &ev.MaxIdleGapSeconds)
	if errors.Is(err, pgx.ErrNoRows) {
		st, err := s.readState(ctx, tx, lease.JobID)
		if err != nil {
			return CompleteResult{}, finishedAttempt{}, nil, done(err)
		}
		if st.Status == StatusCompleted && st.Generation == lease.Generation {
			return CompleteResult{Replayed: true, Confirmed: true}, finishedAttempt{}, nil, done(nil)
		}
		if ferr := fenceError(lease, st); ferr != nil {
			done(ferr)
			return CompleteResult{}, finishedAttempt{}, &lateWrite{op: "Complete", lease: lease, st: st, refusal: ferr}, nil
		}
		return CompleteResult{}, finishedAttempt{}, nil, done(fmt.Errorf("job %s matched no row although it reads PROCESSING at generation %d", lease.JobID, st.Generation))
	}
	if err != nil {
		return CompleteResult{}, finishedAttempt{}, nil, done(err)
	}
	ca.JobID = lease.JobID
	fin := finishedAttempt{typ: ca.Type, outcome: outcomeCompleted, ev: ev}
	detail, err := ev.detail(nil)
	if err != nil {
		return CompleteResult{}, fin, nil, done(err)
	}
	if err := s.appendEvent(ctx, tx, EventCompleted, lease, detail); err != nil {
		return CompleteResult{}, fin, nil, done(err)
	}
	if err := s.core.RunCompleted(ctx, tx, ca); err != nil {
		return CompleteResult{}, fin, nil, done(err)
	}
	// The caller commits tx; tell it now if the cascade ended tx, before it
	// writes its product rows outside any transaction.
	if len(s.core.Cascades()[ca.Type].OnCompleted) > 0 {
		if err := pgcore.CheckTxOpen(tx, "the on_completed cascade of type "+ca.Type); err != nil {
			return CompleteResult{}, fin, nil, done(fmt.Errorf("job %s: %w", lease.JobID, err))
		}
	}
	return CompleteResult{}, fin, nil, done(nil)
}

// CompleteWith completes lease's job and writes the completion's product
// rows in one transaction on db (nil: the Store's handle): Complete first,
// then fn(tx), then commit. fn holds database writes only (product rows,
// the parent's READY flag, a usage charge), never an external call: an API
// request or an upload inside fn cannot be rolled back with tx and would
// hold the job's row lock while it waits. Do such calls before CompleteWith,
// with Lease.IdempotencyKey.
//
// Timeouts: jobreaper's own statements (BEGIN, Complete, COMMIT) each
// have the Store's operation timeout; fn does not. fn runs for as long as
// the context its statements use (normally the handler's ctx) allows, so
// a completion whose product writes take longer than the operation timeout
// still commits.
//
// Retries, only where fn has not run yet: when the transaction cannot begin
// (no connection, a refused or broken one) or Complete fails with a
// connection-level failure, a deadlock or a serialization failure, the
// transaction is rolled back and tried again after 0.25, 0.5, 1, 2 and 4 s
// (six tries at most, each statement with the operation timeout), so a
// completion survives a blip of a few seconds. The retries end early when
// ctx ends: fn's statements and the COMMIT run under ctx, so a completion
// whose handler was stopped (asynq's deadline, a shutdown) could not
// commit anyway, and the task's next attempt takes the job over. Once fn
// ran, nothing is retried here: fn's writes are the caller's to repeat,
// and the errors below say what became of them. The caller may call
// CompleteWith again after any of them: a completion that did commit
// answers Replayed, and one that did not runs fn again (so an external call
// made before it must carry an IdempotencyKey).
//
// A Replayed completion (a retry after a lost commit acknowledgement) does
// not call fn: its rows were committed with the first completion. The
// result is Confirmed when the transaction committed or replayed.
//
// Errors, each saying what became of the transaction: BEGIN failed after
// the retries (nothing written); those of Complete (rolled back, nothing
// written); fn's error, wrapped (rolled back, the job stays PROCESSING);
// ErrTxEnded when the cascade or fn ended the transaction before COMMIT; a
// COMMIT PostgreSQL refused or that was never sent (nothing committed); a
// COMMIT sent without an answer, wrapping ErrCommitUnknown: retry
// CompleteWith, and a committed completion answers Replayed.
func (s *Store) CompleteWith(ctx context.Context, db TxBeginner, lease Lease, fn func(pgx.Tx) error) (CompleteResult, error) {
	if db == nil {
		db = s.core.DB()
	}
	var (
		tx  pgx.Tx
		res CompleteResult
		fin finishedAttempt
	)
	err := s.retryFinal(ctx, func(ctx context.Context, _ bool) error {
		t, err := s.core.Begin(ctx, db, "CompleteWith")
		if err != nil {
			return err
		}
		r, f, late, err := s.complete(ctx, t, lease)
		if late != nil || err != nil {
			s.core.Rollback(ctx, t)
			if late != nil {
				err = late.record(ctx, s)
			}
			return fmt.Errorf("jobs.CompleteWith: job %s: rolled back, nothing written: %w", lease.JobID, err)
		}
		tx, res, fin = t, r, f
		return nil
	})
	if err != nil && ctx.Err() != nil && !errors.Is(err, ErrStaleWorker) && !errors.Is(err, ErrJobTerminal) {
		// The handler's context ended before the completion could be
		// tried (cancel-on-reap, asynq's deadline, a shutdown). When the
		// attempt is late, say so and record it as any late completion
		// is recorded, so the clean-up query of the worker docs finds it:
		// one read and one event on a detached context bounded by the
		// operation timeout.
		if late := s.lateAfterCancel(ctx, lease); late != nil {
			return CompleteResult{}, fmt.Errorf("jobs.CompleteWith: job %s: nothing written (the context ended: %v): %w",
				lease.JobID, context.Cause(ctx), late.record(ctx, s))
		}
	}
	if err != nil {
		return CompleteResult{}, err
	}
	defer s.core.Rollback(ctx, tx)
	if res.Replayed {
		return res, nil
	}
	if fn != nil {
		if err := fn(tx); err != nil {
			return CompleteResult{}, fmt.Errorf("jobs.CompleteWith: completion writes of job %s failed; rolled back, nothing written, the job stays PROCESSING: %w", lease.JobID, err)
		}
	}
	if err := pgcore.CheckTxOpen(tx, "the completion's cascade or function"); err != nil {
		return CompleteResult{}, fmt.Errorf("jobs.CompleteWith: job %s: %w", lease.JobID, err)
	}
	if err := s.core.Commit(ctx, tx); err != nil {
		return CompleteResult{}, fmt.Errorf("jobs.CompleteWith: completing job %s: %w", lease.JobID, err)
	}
	s.metrics.finished(fin)
	return CompleteResult{Confirmed: true}, nil
}

// lateAfterCancel reads lease's job on a context detached from ctx (which
// has ended) and bounded by the operation timeout, and returns the refused
// write to record when the attempt is stale or the job terminal; nil when
// the row could not be read or the attempt still owns it.
func (s *Store) lateAfterCancel(ctx context.Context, lease Lease) *lateWrite {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.core.OpTimeout())
	defer cancel()
	st, err := s.readState(rctx, s.core.DB(), lease.JobID)
	if err != nil {
		return nil
	}
	if ferr := fenceError(lease, st); ferr != nil {
		return &lateWrite{op: "Complete", lease: lease, st: st, refusal: ferr}
	}
	return nil
}

const checkCompletedSQL = `
SELECT status, generation, coalesce(failure_reason, '') FROM {schema}.jobs WHERE id = $1 FOR SHARE`

// CheckCompleted re-checks, in the caller's transaction tx, that lease's
// job is COMPLETED by lease's generation, and holds a share lock on the row
// until tx ends so the status cannot change under the writes that follow.
// Call it first in a transaction that writes what must follow a confirmed
// completion but could not go into the completion's own transaction (a
// usage charge that depends on later metadata writes).
//
// Errors: ErrStaleWorker when another generation owns the job (or this one
// released it) and ErrJobTerminal when it is FAILED, both with a
// late_result_rejected event written outside tx; ErrNotCompleted when it is
// still PROCESSING at this generation; ErrNotFound for a missing row;
// otherwise a wrapped driver error.
func (s *Store) CheckCompleted(ctx context.Context, tx pgx.Tx, lease Lease) error {
	late, err := s.checkCompleted(ctx, tx, lease)
	if late != nil {
		return late.record(ctx, s)
	}
	return err
}

// checkCompleted is CheckCompleted with the event of a refusal left to the
// caller, as complete does.
func (s *Store) checkCompleted(ctx context.Context, tx pgx.Tx, lease Lease) (late *lateWrite, _ error) {
	ctx, done := s.core.Op(ctx, "CheckCompleted")
	var st jobState
	err := lockedRead(func() error {
		return tx.QueryRow(ctx, s.core.Q(checkCompletedSQL), lease.JobID).Scan(&st.Status, &st.Generation, &st.FailureReason)
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, done(fmt.Errorf("job %s: %w", lease.JobID, ErrNotFound))
	}
	if err != nil {
		return nil, done(err)
	}
	if st.Status == StatusCompleted && st.Generation == lease.Generation {
		return nil, done(nil)
	}
	if ferr := fenceError(lease, st); ferr != nil {
		done(ferr)
		return &lateWrite{op: "CheckCompleted", lease: lease, st: st, refusal: ferr}, nil
	}
	return nil, done(fmt.Errorf("job %s is %s at generation %d: %w", lease.JobID, st.Status, st.Generation, ErrNotCompleted))
}

// AfterCompleted runs fn in a transaction on db (nil: the Store's handle)
// that first re-checks with CheckCompleted that lease's job is COMPLETED by
// lease's generation, and commits. Use it for writes that follow a confirmed
// completion, such as a usage charge made only once every metadata update
// succeeded. Like CompleteWith's fn, fn holds database writes only, and
// like it fn is not bounded by the Store's operation timeout: only
// jobreaper's statements (BEGIN, the check, COMMIT) are.
//
// Errors, each saying what became of the transaction: BEGIN failed
// (nothing written); those of CheckCompleted (fn not called, rolled back);
// fn's error, wrapped (rolled back); ErrTxEnded when fn ended the
// transaction before COMMIT; a COMMIT PostgreSQL refused or that was never
// sent (nothing committed); a COMMIT sent without an answer, wrapping
// ErrCommitUnknown.
func (s *Store) AfterCompleted(ctx context.Context, db TxBeginner, lease Lease, fn func(pgx.Tx) error) error {
	if db == nil {
		db = s.core.DB()
	}
	tx, err := s.core.Begin(ctx, db, "AfterCompleted")
	if err != nil {
		return err
	}
	defer s.core.Rollback(ctx, tx)
	late, err := s.checkCompleted(ctx, tx, lease)
	if late != nil {
		// Roll back before the event takes a connection of its own.
		s.core.Rollback(ctx, tx)
		err = late.record(ctx, s)
	}
	if err != nil {
		return fmt.Errorf("jobs.AfterCompleted: job %s: rolled back, fn not called: %w", lease.JobID, err)
	}
	if err := fn(tx); err != nil {
		return fmt.Errorf("jobs.AfterCompleted: writes after the completion of job %s failed; rolled back, nothing written: %w", lease.JobID, err)
	}
	if err := pgcore.CheckTxOpen(tx, "AfterCompleted's function"); err != nil {
		return fmt.Errorf("jobs.AfterCompleted: job %s: %w", lease.JobID, err)
	}
	if err := s.core.Commit(ctx, tx); err != nil {
		return fmt.Errorf("jobs.AfterCompleted: job %s: %w", lease.JobID, err)
	}
	return nil
}
