package queue

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/hibiken/asynq"

	"github.com/jobreaper/jobreaper/jobs"
)

// Failure codes the outcome mapping stores in jobs.failure_reason when the
// handler's error carries none (see Failure).
const (
	// CodeHandlerError: the handler returned an error asynq will not retry
	// (it wraps asynq.SkipRetry).
	CodeHandlerError = "handler_error"
	// CodeRetriesExhausted: the handler failed on the task's last attempt.
	CodeRetriesExhausted = "retries_exhausted"
	// CodeRevoked: the handler returned asynq.RevokeTask, so asynq
	// deletes the task and nothing will run the job again.
	CodeRevoked = "task_revoked"
	// CodePanic: the handler panicked on the task's last attempt (earlier
	// attempts are released for asynq's retry, like any retryable error).
	CodePanic = "handler_panic"
)

// codedError carries the failure code a handler chose.
type codedError struct {
	code string
	err  error
}

func (e *codedError) Error() string { return e.code + ": " + e.err.Error() }
func (e *codedError) Unwrap() error { return e.err }

// Failure returns err tagged with code, a short snake_case failure code
// (for example "source_missing"), for a handler to return. When the
// outcome mapping fails the job, it stores code instead of a generic one;
// err's text goes to the log only, never to the row. A code that
// jobs.CheckFailureCode refuses (not snake_case, too long, or one of the
// reaper's) is ignored and the generic code used.
func Failure(code string, err error) error {
	if err == nil {
		err = errors.New(code)
	}
	return &codedError{code: code, err: err}
}

func failureCode(err error, fallback string) string {
	var c *codedError
	if errors.As(err, &c) && jobs.CheckFailureCode(c.code) == nil {
		return c.code
	}
	return fallback
}

func asynqRetries(ctx context.Context) (retried, maxRetry int, ok bool) {
	retried, ok1 := asynq.GetRetryCount(ctx)
	maxRetry, ok2 := asynq.GetMaxRetry(ctx)
	return retried, maxRetry, ok1 && ok2
}

// settle is the outcome mapping: after the handler of a claimed attempt
// returned err, it brings the job row in line with what asynq will do with
// the task, fenced by the lease. It first reads the row: a job the handler
// already settled (Complete, Fail, Release) or lost (reaped, claimed by a
// newer attempt) gets no write of the mapping, so the mapping never leaves a
// late_result_rejected event of its own. Otherwise:
//
//   - the handler's context was cancelled (not timed out), whatever it
//     returned: asynq is shutting down, which puts the task back in its
//     queue without counting an attempt, or the task was cancelled. asynq's
//     next step is not known here, so nothing is written: the row stays
//     PROCESSING, the next claim takes the job over, and if asynq never
//     runs the task again the reaper fails the job as lost_task.
//   - err is nil: the type is auto_complete and the job is completed now;
//     otherwise the job fails with jobs.ReasonNoCompletion and the task is
//     archived: writing results and then completing afterwards is the order
//     this product exists to prevent.
//   - err wraps asynq.RevokeTask: asynq deletes the task, so the job fails
//     with the code from Failure, else CodeRevoked.
//   - err is retryable (no asynq.SkipRetry, and retries remain): the row
//     goes back to QUEUED with its cursor kept (jobs.Store.Release) and
//     err is returned for asynq to retry.
//   - err is not retryable, or this was the last attempt: the job fails
//     with the code from Failure, else CodeHandlerError or
//     CodeRetriesExhausted, and err is returned wrapped with
//     asynq.SkipRetry.
//
// The writes use a context that asynq's cancellation (task timeout, lost
// lease, shutdown) does not cancel: they are fenced, so a superseded
// attempt changes nothing, and each try has its own timeout in jobs.Store.
// Over a *jobs.Store each write is retried after a connection-level
// failure, a deadlock or a serialization failure (after 0.25, 0.5, 1, 2 and
// 4 s: six tries at most), so an outcome survives a blip of a few seconds.
// A write refused by the fence (the job moved on meanwhile) returns
// asynq.SkipRetry. A write that still fails after its retries is
// settle_failed: counted and logged at ERROR, the row left as it was, and
// asynq's decision kept. A result asynq would retry (a retryable error with
// retries left, or a success whose completion could not be recorded, before
// the last attempt) is returned retryable, and the next claim takes the job
// over; a final one (asynq.SkipRetry, asynq.RevokeTask, the last attempt)
// is returned final, and the job stays PROCESSING until the reaper fails it
// as lost_task.
func (g *Guard) settle(ctx context.Context, lease jobs.Lease, err error) error {
	log := g.logger.With("job_id", lease.JobID, "generation", lease.Generation)
	wctx := context.WithoutCancel(ctx)
	if done, serr := g.settled(wctx, log, lease, err); done {
		return serr
	}
	if errors.Is(ctx.Err(), context.Canceled) {
		g.count(decisionAbandoned)
		log.WarnContext(wctx, "attempt cancelled (worker shutdown or task cancel); the job is left to its next claim", "err", err)
		return err
	}
	retried, maxRetry, ok := g.retries(ctx)
	lastAttempt := ok && retried >= maxRetry
	if err == nil {
		return g.settleSuccess(wctx, log, lease, lastAttempt)
	}
	if errors.Is(err, asynq.RevokeTask) {
		code := failureCode(err, CodeRevoked)
		if ferr := g.store.Fail(wctx, lease, code); ferr != nil {
			return g.settleWriteFailed(wctx, log, lease, "fail", err, ferr, true)
		}
		g.count(decisionFailed)
		log.WarnContext(ctx, "handler revoked its task, job FAILED", "failure_reason", code, "err", err)
		return err
	}
	if !errors.Is(err, asynq.SkipRetry) && !lastAttempt {
		if rerr := g.store.Release(wctx, lease); rerr != nil {
			return g.settleWriteFailed(wctx, log, lease, "release", err, rerr, false)
		}
		g.count(decisionReleased)
		log.InfoContext(ctx, "attempt failed, job back to QUEUED for asynq's retry", "retried", retried, "max_retry", maxRetry, "err", err)
		return err
	}
	code := failureCode(err, CodeHandlerError)
	if !errors.Is(err, asynq.SkipRetry) {
		code = failureCode(err, CodeRetriesExhausted)
	}
	if ferr := g.store.Fail(wctx, lease, code); ferr != nil {
		return g.settleWriteFailed(wctx, log, lease, "fail", err, ferr, true)
	}
	g.count(decisionFailed)
	log.WarnContext(ctx, "attempt failed for good, job FAILED", "failure_reason", code, "err", err)
	return fmt.Errorf("queue.Guard: job %s failed (%s): %w: %w", lease.JobID, code, err, asynq.SkipRetry)
}

// settleSuccess settles a handler that returned nil; lastAttempt says
// asynq will not run the task again if the guard returns an error.
func (g *Guard) settleSuccess(ctx context.Context, log *slog.Logger, lease jobs.Lease, lastAttempt bool) error {
	res, err := g.store.AutoComplete(ctx, lease)
	switch {
	case err == nil && res.Replayed:
		g.count(decisionCompleted)
		return nil
	case err == nil:
		g.count(decisionAutoCompleted)
		log.InfoContext(ctx, "handler returned without Complete; auto_complete type completed")
		return nil
	case errors.Is(err, jobs.ErrNotAutoComplete):
		if ferr := g.store.Fail(ctx, lease, jobs.ReasonNoCompletion); ferr != nil {
			return g.settleWriteFailed(ctx, log, lease, "fail", nil, ferr, lastAttempt)
		}
		g.count(decisionNoCompletion)
		log.WarnContext(ctx, "handler returned without a confirmed Complete; job FAILED",
			"failure_reason", jobs.ReasonNoCompletion)
		return fmt.Errorf("queue.Guard: job %s: handler returned nil without jobs.Complete (type is not auto_complete): %s: %w",
			lease.JobID, jobs.ReasonNoCompletion, asynq.SkipRetry)
	default:
		return g.settleWriteFailed(ctx, log, lease, "complete", nil, err, lastAttempt)
	}
}

// settleWriteFailed handles a settling write that did not go through. A
// fenced refusal means the attempt lost its job: SkipRetry. Anything else
// (an outage that outlasted the write's retries) is settle_failed: the row
// stays as it was, and asynq's decision is kept. When final is false (asynq
// retries the task) it returns the handler's error, or the write's error
// when the handler succeeded, retryable: the next claim takes the job over.
// When final is true (asynq will not run the task again) it returns that
// error wrapped with asynq.SkipRetry: the job stays PROCESSING until the
// reaper fails it as lost_task, and the ERROR line says so.
func (g *Guard) settleWriteFailed(ctx context.Context, log *slog.Logger, lease jobs.Lease, op string, handlerErr, writeErr error, final bool) error {
	log = log.With("op", op)
	if errors.Is(writeErr, jobs.ErrJobTerminal) || errors.Is(writeErr, jobs.ErrStaleWorker) {
		g.count(decisionLostJob)
		log.WarnContext(ctx, "attempt lost its job before it settled, task will not be retried", "reason", jobs.ErrorCode(writeErr))
		return fmt.Errorf("queue.Guard: job %s generation %d: %w: %w", lease.JobID, lease.Generation, writeErr, asynq.SkipRetry)
	}
	g.count(decisionSettleFailed)
	result := handlerErr
	if result == nil {
		result = fmt.Errorf("queue.Guard: job %s: recording the outcome: %w", lease.JobID, writeErr)
	}
	if final {
		log.ErrorContext(ctx, "could not record the attempt's outcome, even after retries; asynq will not run the task again, "+
			"so the job stays PROCESSING until the reaper fails it as lost_task",
			"reason", decisionSettleFailed.String(), "err", writeErr, "handler_err", errText(handlerErr))
		return fmt.Errorf("%w: %w", result, asynq.SkipRetry)
	}
	log.ErrorContext(ctx, "could not record the attempt's outcome, even after retries; asynq retries the task, "+
		"and its next claim takes the job over", "reason", decisionSettleFailed.String(), "err", writeErr, "handler_err", errText(handlerErr))
	return result
}

// errText is err's text, or "" for nil, for a log attribute.
func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// settled reports whether the job no longer needs the mapping's write, and
// then what to return to asynq: the row is not PROCESSING at the lease's
// generation because the handler completed, failed or released it, the
// reaper reaped it, or a newer attempt claimed it. A row that cannot be read
// is left to the fenced writes, which decide the same way. Errors returned
// wrap the handler's err, when there is one, and asynq.SkipRetry.
func (g *Guard) settled(ctx context.Context, log *slog.Logger, lease jobs.Lease, err error) (bool, error) {
	row, rerr := g.store.Get(ctx, lease.JobID)
	if rerr != nil || (row.Status == jobs.StatusProcessing && row.Generation == lease.Generation) {
		return false, nil
	}
	final := func(format string, args ...any) error {
		refusal := fmt.Errorf(format, args...)
		if err != nil {
			return fmt.Errorf("%w: %w: %w", err, refusal, asynq.SkipRetry)
		}
		return fmt.Errorf("%w: %w", refusal, asynq.SkipRetry)
	}
	switch {
	case row.Generation == lease.Generation && row.Status == jobs.StatusQueued:
		// The handler released the job itself: asynq's retry claims it
		// again, and if asynq archives the task instead, the reaper fails
		// the idle QUEUED job as lost_task.
		g.count(decisionReleased)
		return true, err
	case row.Generation != lease.Generation:
		g.count(decisionLostJob)
		log.WarnContext(ctx, "a newer attempt owns the job, task will not be retried", "current_generation", row.Generation)
		return true, final("queue.Guard: job %s generation %d (now %d): %w", lease.JobID, lease.Generation, row.Generation, jobs.ErrStaleWorker)
	case row.Status == jobs.StatusCompleted:
		g.count(decisionCompleted)
		if err != nil {
			log.WarnContext(ctx, "handler returned an error after its job was completed; the completion stands", "err", err)
		}
		return true, nil
	case row.FailureReason == jobs.ReasonStalled || row.FailureReason == jobs.ReasonLostTask:
		g.count(decisionLostJob)
		log.WarnContext(ctx, "job was reaped while the handler ran, task will not be retried", "failure_reason", row.FailureReason)
		return true, final("queue.Guard: job %s generation %d was reaped (%s): %w", lease.JobID, lease.Generation, row.FailureReason, ErrJobReaped)
	default: // FAILED by the handler's own Fail
		g.count(decisionFailed)
		if err == nil {
			return true, nil
		}
		return true, final("queue.Guard: job %s failed (%s)", lease.JobID, row.FailureReason)
	}
}
