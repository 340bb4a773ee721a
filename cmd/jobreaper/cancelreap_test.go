package main

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jackc/pgx/v5"

	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
	"github.com/jobreaper/jobreaper/queue"
	"github.com/jobreaper/jobreaper/queue/queuetest"
)

// TestCase_B30_ReapedHandlersAreCancelledAndTheirSlotsFreed: a worker with
// Concurrency 2 runs two handlers that hang on a call honouring their
// context. Both jobs are reaped; the reaper asks asynq to cancel their
// handlers, both see their context cancelled, their late Completes are
// refused, and a third task enqueued afterwards runs on that worker.
func TestCase_B30_ReapedHandlersAreCancelledAndTheirSlotsFreed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := jobstest.New(t)
	rdb := e2eRedis(t)
	q := "b30_" + db.Schema
	j1, j2, j3 := q+"-1", q+"-2", q+"-3"
	t.Cleanup(func() {
		_ = queuetest.Remove(context.Background(), rdb, q)
		rdb.Del(context.Background(), queue.MarkerKey(j1), queue.MarkerKey(j2), queue.MarkerKey(j3))
	})
	db.JobType(t, "report.export", "30 minutes", "", "")
	for _, id := range []string{j1, j2, j3} {
		db.Insert(t, jobstest.Job{ID: id, Type: "report.export", Status: jobs.StatusQueued, Queue: q})
	}
	store := db.Store()
	markers, err := queue.NewMarkerStore(rdb)
	if err != nil {
		t.Fatal(err)
	}
	srv := asynq.NewServerFromRedisClient(rdb, asynq.Config{
		Queues: map[string]int{q: 1}, Concurrency: 2, ShutdownTimeout: 300 * time.Millisecond,
		LogLevel: asynq.FatalLevel, IsFailure: queue.IsFailure,
	})
	var mu sync.Mutex
	late := map[string]error{}
	running := make(chan string, 3)
	mux := asynq.NewServeMux()
	mux.Use(queue.NewGuard(store, markers, queue.WithWorker("w1")).Middleware())
	mux.HandleFunc("report.export", func(ctx context.Context, _ *asynq.Task) error {
		lease, err := jobs.LeaseFromContext(ctx)
		if err != nil {
			return err
		}
		running <- lease.JobID
		if lease.JobID != j3 {
			<-ctx.Done() // the hung external call, which honours its context
		}
		_, err = store.CompleteWith(context.WithoutCancel(ctx), db.Pool, lease, func(pgx.Tx) error { return nil })
		mu.Lock()
		late[lease.JobID] = err
		mu.Unlock()
		return err
	})
	if err := srv.Start(mux); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	client := asynq.NewClientFromRedisClient(rdb)
	for _, id := range []string{j1, j2} {
		if _, err := queue.Enqueue(ctx, client, store, asynq.NewTask("report.export", nil), id); err != nil {
			t.Fatal(err)
		}
	}
	for range 2 {
		select {
		case <-running:
		case <-time.After(30 * time.Second):
			t.Fatal("the worker did not start both handlers within 30s")
		}
	}
	// Both slots are taken; both jobs are past their limit and idle.
	db.Exec(t, `UPDATE jobs SET started_at = now() - interval '31 minutes', updated_at = now() - interval '21 minutes' WHERE id = ANY($1)`,
		[]string{j1, j2})

	r := run(t, "run", "--once", "--database-url", db.URL, "--schema", db.Schema, "--redis-url", e2eRedisURL, "--queues", q)
	requireExit(t, r, exitOK)
	if !strings.Contains(r.stdout, "reaped 2") || !strings.Contains(r.stderr, "asked asynq to cancel the running handlers of reaped jobs") {
		t.Fatalf("stdout %q\nstderr %s", r.stdout, r.stderr)
	}
	jobstest.Eventually(t, "both handlers saw their context cancelled and tried to complete", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return late[j1] != nil && late[j2] != nil
	})
	mu.Lock()
	for _, id := range []string{j1, j2} {
		if !errors.Is(late[id], jobs.ErrJobTerminal) {
			t.Errorf("late Complete of %s = %v, want ErrJobTerminal", id, late[id])
		}
	}
	mu.Unlock()
	for _, id := range []string{j1, j2} {
		if row := db.Read(t, id); row.Status != jobs.StatusFailed || row.FailureReason != jobs.ReasonStalled {
			t.Fatalf("%s = %+v, want FAILED stalled", id, row)
		}
		if n := len(db.LateResults(t, id)); n != 1 {
			t.Fatalf("%s has %d late_result_rejected events, want 1", id, n)
		}
	}

	// A third task runs on the worker whose two slots were taken.
	if _, err := queue.Enqueue(ctx, client, store, asynq.NewTask("report.export", nil), j3); err != nil {
		t.Fatal(err)
	}
	jobstest.Eventually(t, "the third task ran and completed", func() bool {
		return db.Read(t, j3).Status == jobs.StatusCompleted
	})
}
