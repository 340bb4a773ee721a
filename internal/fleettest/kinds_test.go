package fleettest_test

import (
	"encoding/json"
	"testing"

	"github.com/hibiken/asynq"

	"github.com/jobreaper/jobreaper/internal/fleettest"
	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
	"github.com/jobreaper/jobreaper/queue"
	"github.com/jobreaper/jobreaper/queue/redistest"
)

// The worker program's kinds and commands, each job ending as its kind
// says, with no daemon: fail (on the last attempt: FAILED with its code),
// error (released, then retried as retry_kind complete), nil (an
// auto_complete type: COMPLETED), completed, complete after a go command,
// and two heartbeat jobs, one told to hang (it says so and then only its
// context ends it), one told to finish (it completes). A worker serves
// two queues; a command names one job or all, and the worker says to how
// many running handlers it applied it.
func TestHarnessWorkerKindsAndCommands(t *testing.T) {
	t.Parallel()
	db := jobstest.New(t)
	srv := redistest.Start(t)
	db.JobType(t, "kinds.plain", "30 minutes", "", "")
	db.JobType(t, "kinds.auto", "30 minutes", "", "")
	db.Exec(t, `UPDATE job_types SET auto_complete = true WHERE name = 'kinds.auto'`)
	w := fleettest.StartWorker(t, fleettest.BuildWorker(t), fleettest.WorkerOptions{Name: "w1",
		DatabaseURL: db.URL, Schema: db.Schema, RedisURL: srv.URL, Queue: "kinds-a,kinds-b",
		Args: []string{"--concurrency", "10", "--retry-delay", "100ms"}})
	store, client := db.Store(), asynq.NewClientFromRedisClient(srv.Client(t))
	t.Cleanup(func() { _ = client.Close() })
	enqueue := func(id, typ, q string, p map[string]any, opts ...asynq.Option) {
		t.Helper()
		db.Insert(t, jobstest.Job{ID: id, Type: typ, Status: jobs.StatusQueued, Queue: q})
		raw, err := json.Marshal(p)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := queue.Enqueue(t.Context(), client, store, asynq.NewTask(typ, raw), id, opts...); err != nil {
			t.Fatalf("enqueueing %s: %v", id, err)
		}
	}
	enqueue("J-fail", "kinds.plain", "kinds-a", map[string]any{"kind": "fail", "code": "upstream_down"}, asynq.MaxRetry(0))
	enqueue("J-error", "kinds.plain", "kinds-a", map[string]any{"kind": "error", "retry_kind": "complete"}, asynq.MaxRetry(3))
	enqueue("J-nil", "kinds.auto", "kinds-b", map[string]any{"kind": "nil"})
	enqueue("J-completed", "kinds.plain", "kinds-b", map[string]any{"kind": "completed"})
	enqueue("J-wait", "kinds.plain", "kinds-a", map[string]any{"kind": "complete", "wait": true})
	enqueue("J-hang", "kinds.plain", "kinds-a", map[string]any{"kind": "heartbeat", "heartbeat_every": "50ms"})
	enqueue("J-finish", "kinds.plain", "kinds-b", map[string]any{"kind": "heartbeat", "heartbeat_every": "50ms"})

	w.Await(t, "waiting J-wait generation 1")
	if got := db.Read(t, "J-wait").Status; got != jobs.StatusProcessing {
		t.Fatalf("J-wait is %s while it waits, want PROCESSING", got)
	}
	if n := w.Tell(t, "go J-wait"); n != 1 {
		t.Fatalf("go J-wait reached %d handlers, want 1", n)
	}
	w.Await(t, "start J-hang generation 1 kind heartbeat")
	w.Await(t, "start J-finish generation 1 kind heartbeat")
	if n := w.Tell(t, "hang J-hang"); n != 1 {
		t.Fatalf("hang J-hang reached %d handlers, want 1", n)
	}
	w.Await(t, "hung J-hang generation 1")
	if n := w.Tell(t, "finish all"); n != 2 {
		t.Fatalf("finish all reached %d handlers, want the 2 heartbeat ones still running", n)
	}
	w.Await(t, "completed J-finish generation 1")
	if n := w.Tell(t, "go J-nobody"); n != 0 {
		t.Fatalf("go J-nobody reached %d handlers, want 0", n)
	}
	w.Await(t, "start J-error generation 2 kind complete")
	for id, want := range map[string]struct{ status, reason string }{
		"J-fail": {jobs.StatusFailed, "upstream_down"}, "J-error": {jobs.StatusCompleted, ""}, "J-nil": {jobs.StatusCompleted, ""},
		"J-completed": {jobs.StatusCompleted, ""}, "J-wait": {jobs.StatusCompleted, ""}, "J-finish": {jobs.StatusCompleted, ""},
		"J-hang": {jobs.StatusProcessing, ""},
	} {
		fleettest.WaitFor(t, id+" ends as its kind says", func() bool {
			r := db.Read(t, id)
			return r.Status == want.status && r.FailureReason == want.reason
		})
	}
	if n := w.Count("start J-"); n != 8 {
		t.Fatalf("the worker started %d handlers, want 8 (J-error twice):\n%v", n, w.Said())
	}
}
