package queue

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jackc/pgx/v5"

	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
)

// A worker shut down during a rolling deploy, on its task's last attempt:
// asynq waits ShutdownTimeout, puts the task back in its queue without
// counting an attempt and cancels the handler, which returns ctx.Err(). The
// outcome mapping must not fail the job (it would then refuse the task that
// asynq is about to deliver again): the next worker claims it and
// completes it.
func TestShutdownOnTheLastAttemptLeavesTheJobToTheNextWorker(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name         string
		returnNil    bool
		autoComplete bool
	}{
		{"HandlerReturnsCtxErr", false, false},
		{"HandlerReturnsNil", true, false},
		{"AutoCompleteHandlerReturnsNil", true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			shutdownOnLastAttempt(t, tc.returnNil, tc.autoComplete)
		})
	}
}

func shutdownOnLastAttempt(t *testing.T, returnNil, autoComplete bool) {
	db := jobstest.New(t)
	db.JobType(t, "report.export", "30 minutes", "", "")
	db.Exec(t, `UPDATE job_types SET auto_complete = $1`, autoComplete)
	rc := realRedis(t)
	q := unique(t, "shutdown-")
	deleteQueueAtCleanup(t, rc, q)
	id := unique(t, "J18-")
	db.Insert(t, jobstest.Job{ID: id, Type: "report.export", Status: jobs.StatusQueued, Queue: q})
	store := db.Store()
	markers, err := NewMarkerStore(rc)
	if err != nil {
		t.Fatal(err)
	}
	newServer := func(worker string, handler asynq.HandlerFunc) *asynq.Server {
		srv := asynq.NewServerFromRedisClient(rc, asynq.Config{
			Queues: map[string]int{q: 1}, Concurrency: 1, ShutdownTimeout: 200 * time.Millisecond,
			IsFailure: IsFailure, Logger: asynqLogger{},
		})
		mux := asynq.NewServeMux()
		mux.Use(NewGuard(store, markers, WithWorker(worker), WithLogger(testLogger(t))).Middleware())
		mux.Handle("report.export", handler)
		if err := srv.Start(mux); err != nil {
			t.Fatal(err)
		}
		return srv
	}

	started := make(chan struct{})
	w1 := newServer("W1", func(ctx context.Context, _ *asynq.Task) error {
		close(started)
		<-ctx.Done() // a well-behaved long job stops when asked
		if returnNil {
			return nil
		}
		return ctx.Err()
	})
	client := asynq.NewClientFromRedisClient(rc)
	if _, err := Enqueue(t.Context(), client, store, asynq.NewTask("report.export", nil), id, asynq.MaxRetry(0)); err != nil {
		t.Fatal(err)
	}
	select {
	case <-started:
	case <-time.After(10 * time.Second):
		t.Fatal("W1 did not start the task within 10s")
	}
	w1.Shutdown()
	if r := requireRow(t, db, id, jobs.StatusProcessing, 1); r.FailureReason != "" {
		t.Fatalf("after W1's shutdown the row is %+v, want PROCESSING at generation 1 without a failure", r)
	}

	w2 := newServer("W2", func(ctx context.Context, _ *asynq.Task) error {
		lease, err := jobs.LeaseFromContext(ctx)
		if err != nil {
			return err
		}
		_, err = store.CompleteWith(ctx, nil, lease, func(pgx.Tx) error { return nil })
		return err
	})
	t.Cleanup(w2.Shutdown)
	jobstest.Eventually(t, "W2 completes the job", func() bool {
		var status string
		err := db.Pool.QueryRow(t.Context(), `SELECT status FROM jobs WHERE id = $1`, id).Scan(&status)
		return err == nil && status == jobs.StatusCompleted
	})
	requireRow(t, db, id, jobs.StatusCompleted, 2)
}

func TestOutcomeMappingOfRevokesReleasesAndReservedCodes(t *testing.T) {
	t.Parallel()

	t.Run("RevokedTaskFailsTheJob", func(t *testing.T) {
		t.Parallel()
		b := setupGuard(t)
		b.db.Insert(t, jobstest.Job{ID: "J1", Type: "report.export", Status: jobs.StatusQueued})
		err := deliver(t.Context(), attempt(b.guard(t, "W1", nil, nil), 0, 3), "J1",
			handlerFunc(func(context.Context) error { return asynq.RevokeTask }))
		if !errors.Is(err, asynq.RevokeTask) {
			t.Fatalf("guard returned %v, want asynq.RevokeTask passed on", err)
		}
		if r := requireRow(t, b.db, "J1", jobs.StatusFailed, 1); r.FailureReason != CodeRevoked {
			t.Fatalf("failure_reason = %q, want %s", r.FailureReason, CodeRevoked)
		}
	})

	t.Run("HandlersOwnReleaseIsKeptAndItsErrorRetried", func(t *testing.T) {
		t.Parallel()
		b := setupGuard(t)
		b.db.Insert(t, jobstest.Job{ID: "J1", Type: "report.export", Status: jobs.StatusQueued})
		boom := errors.New("rate limited, try later")
		err := deliver(t.Context(), attempt(b.guard(t, "W1", nil, nil), 0, 3), "J1", handlerFunc(func(ctx context.Context) error {
			lease, _ := jobs.LeaseFromContext(ctx)
			if err := b.store.Release(ctx, lease); err != nil {
				return err
			}
			return boom
		}))
		if !errors.Is(err, boom) || errors.Is(err, asynq.SkipRetry) {
			t.Fatalf("guard returned %v, want the handler's error for asynq to retry", err)
		}
		requireRow(t, b.db, "J1", jobs.StatusQueued, 1)
	})

	t.Run("ReapersCodesAreNotAHandlersToUse", func(t *testing.T) {
		t.Parallel()
		b := setupGuard(t)
		b.db.Insert(t, jobstest.Job{ID: "J1", Type: "report.export", Status: jobs.StatusQueued})
		err := deliver(t.Context(), attempt(b.guard(t, "W1", nil, nil), 0, 3), "J1",
			handlerFunc(func(context.Context) error { return Failure("stalled", asynq.SkipRetry) }))
		if !errors.Is(err, asynq.SkipRetry) {
			t.Fatalf("guard returned %v, want SkipRetry", err)
		}
		if r := requireRow(t, b.db, "J1", jobs.StatusFailed, 1); r.FailureReason != CodeHandlerError {
			t.Fatalf("failure_reason = %q, want %s: stalled is the reaper's", r.FailureReason, CodeHandlerError)
		}
	})
}
