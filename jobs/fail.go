package jobs

import (
	"context"
	"errors"
	"fmt"
	"regexp"

	"github.com/jackc/pgx/v5"

	"github.com/jobreaper/jobreaper/internal/pgcore"
)

// Failure reasons that jobreaper itself writes: fixed codes stored in
// jobs.failure_reason, never error text. CheckFailureCode refuses the
// first three to a worker's Fail, so that each always means what it says.
const (
	// ReasonStalled: reaped because runtime exceeded the type's max_runtime
	// and the job made no progress for the stall timeout.
	ReasonStalled = "stalled"
	// ReasonLostTask: reaped because asynq will never run the job's task
	// again (archived, completed or gone) while the row said PROCESSING.
	ReasonLostTask = "lost_task"
	// ReasonCancelled: an operator cancelled the job (`jobreaper cancel`).
	// Like the reaper's codes it is reserved, and the marker repair
	// re-sets a cancelled job's marker like a reaped one's.
	ReasonCancelled = "cancelled"
)

// ReasonNoCompletion is the failure code of a job whose handler returned
// success without a confirmed Complete while its type is not auto-complete:
// writing product rows first and completing afterwards is the order that
// lets a late result undo a recovery, so it is refused.
const ReasonNoCompletion = "no_completion"

// MaxFailureCodeLength bounds a failure code (bytes).
const MaxFailureCodeLength = 64

// failureCodePattern is a snake_case identifier: lower-case words of
// letters and digits joined by single underscores.
var failureCodePattern = regexp.MustCompile(`^[a-z][a-z0-9]*(_[a-z0-9]+)*$`)

// CheckFailureCode reports whether code may be stored in failure_reason: a
// short snake_case identifier (at most MaxFailureCodeLength bytes) such as
// "upstream_timeout". Error text is refused: it varies per occurrence,
// breaks grouping and metrics, and may carry URLs or secrets; it belongs in
// the log. The reaper's codes, stalled and lost_task, are refused too: the
// start guard and marker repair read them as a reap; so is cancelled, which
// only an operator's `jobreaper cancel` writes. The error wraps
// ErrInvalidArgument and, for the same reason, does not quote a refused
// error text.
func CheckFailureCode(code string) error {
	if len(code) > MaxFailureCodeLength || !failureCodePattern.MatchString(code) {
		// The refused value is not quoted: it is often error text, which may
		// carry a URL with a token.
		return fmt.Errorf("failure code (%d bytes) must be a snake_case identifier of at most %d bytes, such as upstream_timeout, never error text: %w",
			len(code), MaxFailureCodeLength, ErrInvalidArgument)
	}
	if code == ReasonStalled || code == ReasonLostTask {
		return fmt.Errorf("failure code %s is reserved for the reaper (the guard and marker repair read it as a reap): %w", code, ErrInvalidArgument)
	}
	if code == ReasonCancelled {
		return fmt.Errorf("failure code %s is reserved for an operator's jobreaper cancel (marker repair reads it as one): %w", code, ErrInvalidArgument)
	}
	return nil
}

// failSQL ends the attempt as FAILED, keeping its longest progress gap
// (keepIdleGapSQL), and returns what the cascade and the failed event need
// (attemptEvidenceSQL).
const failSQL = `
UPDATE {schema}.jobs j SET status = 'FAILED', failure_reason = @code, finished_at = now(), ` + keepIdleGapSQL + `
 WHERE j.id = @job_id AND j.status = 'PROCESSING' AND j.generation = @generation
RETURNING j.type, coalesce(j.parent_id, ''), coalesce(j.tenant_id, ''), ` + attemptEvidenceSQL

// Fail ends lease's attempt and its job as FAILED with the fixed failure
// code (see CheckFailureCode; the error's text goes to the log, not here).
// In one transaction it runs the fenced UPDATE (status PROCESSING, the
// lease's generation) that also sets finished_at and keeps the attempt's
// longest progress gap, appends a "failed" event (its detail: the code,
// runtime_seconds and max_idle_gap_seconds) and runs the type's on_failed
// cascade, the same cascade a reap runs, so a worker-reported failure and
// a reap are one domain transition. Once committed, the attempt's runtime
// is observed in jobreaper_job_runtime_seconds (WithRegisterer).
//
// A try that meets a connection-level failure, a deadlock or a
// serialization failure is rolled back and tried again after 0.25, 0.5, 1,
// 2 and 4 s (six tries at most, each with the operation timeout), until
// ctx ends: a finalization should survive a blip. A COMMIT whose answer
// was lost is resolved by the next try: a job it finds FAILED at the
// lease's generation with this code was failed by this call, which then
// succeeds without a late_result_rejected event.
//
// Errors: ErrInvalidArgument for a bad code (nothing sent); ErrStaleWorker
// when another generation owns the job or this attempt released it, and
// ErrJobTerminal when it is already COMPLETED or FAILED, both with a
// late_result_rejected event; ErrNotFound for a missing row; a wrapped
// cascade error (nothing written); ErrTxEnded when a cascade statement ended
// the transaction (not reported as failed by this call); otherwise the last
// try's wrapped driver error or timeout (nothing written, unless it wraps
// ErrCommitUnknown).
func (s *Store) Fail(ctx context.Context, lease Lease, code string) error {
	if err := CheckFailureCode(code); err != nil {
		return fmt.Errorf("jobs.Fail: job %s: %w", lease.JobID, err)
	}
	return s.retryFinal(ctx, func(ctx context.Context, maybeDone bool) error {
		return s.failOnce(ctx, lease, code, maybeDone)
	})
}

// failOnce is one try of Fail.
func (s *Store) failOnce(ctx context.Context, lease Lease, code string, maybeDone bool) error {
	ctx, done := s.core.Op(ctx, "Fail")
	matched := false
	var fin finishedAttempt
	err := s.core.InTx(ctx, func(tx pgx.Tx) error {
		var (
			ca pgcore.CascadeArgs
			ev attemptEvidence
		)
		err := tx.QueryRow(ctx, s.core.Q(failSQL), namedLease(lease, "code", code)).
			Scan(&ca.Type, &ca.ParentID, &ca.TenantID, &ev.RuntimeSeconds, &ev.MaxIdleGapSeconds)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		if err != nil {
			return err
		}
		matched = true
		fin = finishedAttempt{typ: ca.Type, outcome: outcomeFailed, ev: ev}
		detail, err := ev.detail(map[string]any{"code": code})
		if err != nil {
			return err
		}
		if err := s.appendEvent(ctx, tx, EventFailed, lease, detail); err != nil {
			return err
		}
		ca.JobID = lease.JobID
		return s.core.RunFailed(ctx, tx, ca)
	})
	if err == nil && matched {
		s.metrics.finished(fin)
	}
	if err != nil || matched {
		return done(err)
	}
	own := func(st jobState) bool {
		return maybeDone && st.Status == StatusFailed && st.Generation == lease.Generation && st.FailureReason == code
	}
	return done(s.refuseFinal(ctx, "Fail", lease, own))
}
