package queue

import (
	"context"
	"errors"
	"testing"

	"github.com/hibiken/asynq"
	"github.com/jackc/pgx/v5"

	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
)

// handlerFunc adapts a function to asynq.Handler and counts its runs.
type handlerFunc func(ctx context.Context) error

func (f handlerFunc) ProcessTask(ctx context.Context, _ *asynq.Task) error { return f(ctx) }

// attempt sets the retry count the guard sees for the delivery.
func attempt(g *Guard, retried, maxRetry int) *Guard {
	g.retries = func(context.Context) (int, int, bool) { return retried, maxRetry, true }
	return g
}

func TestOutcomeMapping(t *testing.T) {
	t.Parallel()

	setup := func(t *testing.T, autoComplete bool) *guardBundle {
		b := setupGuard(t)
		b.db.Exec(t, `UPDATE job_types SET auto_complete = $1 WHERE name = 'report.export'`, autoComplete)
		b.db.Insert(t, jobstest.Job{ID: "J1", Type: "report.export", Status: jobs.StatusQueued, Cursor: 2, Total: ptr(int64(4))})
		return b
	}

	t.Run("ConfirmedCompleteIsAcknowledged", func(t *testing.T) {
		t.Parallel()
		b := setup(t, false)
		h := handlerFunc(func(ctx context.Context) error {
			lease, err := jobs.LeaseFromContext(ctx)
			if err != nil {
				return err
			}
			_, err = b.store.CompleteWith(ctx, nil, lease, func(pgx.Tx) error { return nil })
			return err
		})
		if err := deliver(t.Context(), attempt(b.guard(t, "W1", nil, nil), 0, 3), "J1", h); err != nil {
			t.Fatalf("guard returned %v, want nil", err)
		}
		requireRow(t, b.db, "J1", jobs.StatusCompleted, 1)
	})

	t.Run("SuccessWithoutCompleteFailsAsNoCompletion", func(t *testing.T) {
		t.Parallel()
		b := setup(t, false)
		err := deliver(t.Context(), attempt(b.guard(t, "W1", nil, nil), 0, 3), "J1", handlerFunc(func(context.Context) error { return nil }))
		if !errors.Is(err, asynq.SkipRetry) {
			t.Fatalf("guard returned %v, want SkipRetry", err)
		}
		r := requireRow(t, b.db, "J1", jobs.StatusFailed, 1)
		if r.FailureReason != jobs.ReasonNoCompletion {
			t.Fatalf("failure_reason = %q, want no_completion", r.FailureReason)
		}
	})

	t.Run("SuccessOfAutoCompleteTypeCompletes", func(t *testing.T) {
		t.Parallel()
		b := setup(t, true)
		if err := deliver(t.Context(), attempt(b.guard(t, "W1", nil, nil), 0, 3), "J1", handlerFunc(func(context.Context) error { return nil })); err != nil {
			t.Fatalf("guard returned %v, want nil", err)
		}
		requireRow(t, b.db, "J1", jobs.StatusCompleted, 1)
	})

	t.Run("RetryableErrorPutsTheJobBackToQueuedWithItsCursor", func(t *testing.T) {
		t.Parallel()
		b := setup(t, false)
		boom := errors.New("model API: 503")
		err := deliver(t.Context(), attempt(b.guard(t, "W1", nil, nil), 1, 3), "J1", handlerFunc(func(context.Context) error { return boom }))
		if !errors.Is(err, boom) || errors.Is(err, asynq.SkipRetry) {
			t.Fatalf("guard returned %v, want the handler's error for asynq to retry", err)
		}
		r := requireRow(t, b.db, "J1", jobs.StatusQueued, 1)
		if r.Cursor != 2 || r.FailureReason != "" {
			t.Fatalf("row = %+v, want cursor 2 kept and no failure reason", r)
		}
		// The retry claims generation 2 and resumes at the cursor.
		var resumed int64 = -1
		h := handlerFunc(func(ctx context.Context) error {
			lease, _ := jobs.LeaseFromContext(ctx)
			resumed = lease.Cursor
			return nil
		})
		_ = deliver(t.Context(), attempt(b.guard(t, "W2", nil, nil), 2, 3), "J1", h)
		if resumed != 2 {
			t.Fatalf("retry resumed at cursor %d, want 2", resumed)
		}
	})

	t.Run("LastAttemptErrorFailsAsRetriesExhausted", func(t *testing.T) {
		t.Parallel()
		b := setup(t, false)
		err := deliver(t.Context(), attempt(b.guard(t, "W1", nil, nil), 3, 3), "J1", handlerFunc(func(context.Context) error { return errors.New("timeout") }))
		if !errors.Is(err, asynq.SkipRetry) {
			t.Fatalf("guard returned %v, want SkipRetry", err)
		}
		if r := requireRow(t, b.db, "J1", jobs.StatusFailed, 1); r.FailureReason != CodeRetriesExhausted {
			t.Fatalf("failure_reason = %q, want %s", r.FailureReason, CodeRetriesExhausted)
		}
	})

	t.Run("NonRetryableErrorStoresTheHandlersCodeNotItsText", func(t *testing.T) {
		t.Parallel()
		b := setup(t, false)
		cause := errors.New("s3://bucket/key?X-Amz-Signature=secret not found")
		err := deliver(t.Context(), attempt(b.guard(t, "W1", nil, nil), 0, 3), "J1",
			handlerFunc(func(context.Context) error { return Failure("source_missing", errors.Join(cause, asynq.SkipRetry)) }))
		if !errors.Is(err, asynq.SkipRetry) || !errors.Is(err, cause) {
			t.Fatalf("guard returned %v, want SkipRetry wrapping the cause", err)
		}
		if r := requireRow(t, b.db, "J1", jobs.StatusFailed, 1); r.FailureReason != "source_missing" {
			t.Fatalf("failure_reason = %q, want source_missing", r.FailureReason)
		}
	})

	t.Run("HandlerThatLostItsJobIsNotRetriedAndWritesNothing", func(t *testing.T) {
		t.Parallel()
		b := setup(t, false)
		h := handlerFunc(func(ctx context.Context) error {
			lease, _ := jobs.LeaseFromContext(ctx)
			// The reaper fails the job while the handler runs.
			b.db.Exec(t, `UPDATE jobs SET status = 'FAILED', failure_reason = 'stalled' WHERE id = 'J1'`)
			_, err := b.store.CompleteWith(ctx, nil, lease, func(pgx.Tx) error { return nil })
			return err
		})
		err := deliver(t.Context(), attempt(b.guard(t, "W1", nil, nil), 0, 3), "J1", h)
		if !errors.Is(err, asynq.SkipRetry) || !errors.Is(err, jobs.ErrJobTerminal) {
			t.Fatalf("guard returned %v, want SkipRetry wrapping ErrJobTerminal", err)
		}
		if r := requireRow(t, b.db, "J1", jobs.StatusFailed, 1); r.FailureReason != "stalled" {
			t.Fatalf("failure_reason = %q, want stalled kept", r.FailureReason)
		}
	})

	t.Run("RetryableErrorOfASupersededAttemptIsNotRetried", func(t *testing.T) {
		t.Parallel()
		b := setup(t, false)
		h := handlerFunc(func(ctx context.Context) error {
			// A newer attempt claims the job while this one runs.
			if _, err := b.store.Claim(ctx, "J1", 1, "W9"); err != nil {
				t.Error(err)
			}
			return errors.New("connection reset")
		})
		err := deliver(t.Context(), attempt(b.guard(t, "W1", nil, nil), 0, 3), "J1", h)
		if !errors.Is(err, asynq.SkipRetry) || !errors.Is(err, jobs.ErrStaleWorker) {
			t.Fatalf("guard returned %v, want SkipRetry wrapping ErrStaleWorker", err)
		}
		requireRow(t, b.db, "J1", jobs.StatusProcessing, 2)
	})
}

func ptr[T any](v T) *T { return &v }

func TestOutcomeMappingAfterTheHandlerSettledItself(t *testing.T) {
	t.Parallel()

	for _, tc := range []struct {
		name    string
		returns func() error
		wantErr bool
	}{
		{"FailThenNilIsAcknowledged", func() error { return nil }, false},
		{"FailThenSkipRetryIsArchived", func() error { return errors.Join(errors.New("upstream 500"), asynq.SkipRetry) }, true},
		{"FailThenRetryableErrorIsNotRetried", func() error { return errors.New("upstream 500") }, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setupGuard(t)
			b.db.Insert(t, jobstest.Job{ID: "J1", Type: "report.export", Status: jobs.StatusQueued})
			h := handlerFunc(func(ctx context.Context) error {
				lease, err := jobs.LeaseFromContext(ctx)
				if err != nil {
					return err
				}
				if err := b.store.Fail(ctx, lease, "upstream_timeout"); err != nil {
					return err
				}
				return tc.returns()
			})
			err := deliver(t.Context(), attempt(b.guard(t, "W1", nil, nil), 0, 3), "J1", h)
			if tc.wantErr != (err != nil) || (err != nil && !errors.Is(err, asynq.SkipRetry)) {
				t.Fatalf("guard returned %v; want nil: %v, else SkipRetry", err, !tc.wantErr)
			}
			if r := requireRow(t, b.db, "J1", jobs.StatusFailed, 1); r.FailureReason != "upstream_timeout" {
				t.Fatalf("failure_reason = %q, want upstream_timeout", r.FailureReason)
			}
			if n := b.db.Events(t, "J1", jobs.EventLateResultRejected); n != 0 {
				t.Fatalf("late_result_rejected events = %d, want 0: the handler settled its own job", n)
			}
		})
	}

	t.Run("CompletedThenErrorIsAcknowledged", func(t *testing.T) {
		t.Parallel()
		b := setupGuard(t)
		b.db.Insert(t, jobstest.Job{ID: "J1", Type: "report.export", Status: jobs.StatusQueued})
		h := handlerFunc(func(ctx context.Context) error {
			lease, _ := jobs.LeaseFromContext(ctx)
			if _, err := b.store.CompleteWith(ctx, nil, lease, nil); err != nil {
				return err
			}
			return errors.New("metadata update failed after completion")
		})
		if err := deliver(t.Context(), attempt(b.guard(t, "W1", nil, nil), 0, 3), "J1", h); err != nil {
			t.Fatalf("guard returned %v, want nil: the completion stands", err)
		}
		requireRow(t, b.db, "J1", jobs.StatusCompleted, 1)
		if n := b.db.Events(t, "J1", jobs.EventLateResultRejected); n != 0 {
			t.Fatalf("late_result_rejected events = %d, want 0", n)
		}
	})

	t.Run("ReapedWhileRunningIsNotRetriedAndWritesNoEvent", func(t *testing.T) {
		t.Parallel()
		b := setupGuard(t)
		b.db.Insert(t, jobstest.Job{ID: "J1", Type: "report.export", Status: jobs.StatusQueued})
		h := handlerFunc(func(context.Context) error {
			b.db.Exec(t, `UPDATE jobs SET status = 'FAILED', failure_reason = 'stalled' WHERE id = 'J1'`)
			return errors.New("the hung call finally failed")
		})
		err := deliver(t.Context(), attempt(b.guard(t, "W1", nil, nil), 0, 3), "J1", h)
		if !errors.Is(err, asynq.SkipRetry) || !errors.Is(err, ErrJobReaped) {
			t.Fatalf("guard returned %v, want SkipRetry wrapping ErrJobReaped", err)
		}
		if n := b.db.Events(t, "J1", jobs.EventLateResultRejected); n != 0 {
			t.Fatalf("late_result_rejected events = %d, want 0 (the handler wrote nothing late)", n)
		}
	})
}

func TestOutcomeMappingOfAPanickingHandler(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name           string
		retried        int
		status, reason string
		wantGeneration int64
	}{
		{"EarlierAttemptIsReleasedForTheRetry", 0, jobs.StatusQueued, "", 1},
		{"LastAttemptFailsAsHandlerPanic", 3, jobs.StatusFailed, CodePanic, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setupGuard(t)
			b.db.Insert(t, jobstest.Job{ID: "J1", Type: "report.export", Status: jobs.StatusQueued})
			h := handlerFunc(func(context.Context) error { panic("nil map write") })
			var recovered any
			func() {
				defer func() { recovered = recover() }()
				_ = deliver(t.Context(), attempt(b.guard(t, "W1", nil, nil), tc.retried, 3), "J1", h)
			}()
			if recovered != "nil map write" {
				t.Fatalf("recovered %v, want the handler's panic to reach asynq", recovered)
			}
			if r := requireRow(t, b.db, "J1", tc.status, tc.wantGeneration); r.FailureReason != tc.reason {
				t.Fatalf("failure_reason = %q, want %q", r.FailureReason, tc.reason)
			}
		})
	}
}
