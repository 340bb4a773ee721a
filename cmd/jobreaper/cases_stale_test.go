package main

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/jobreaper/jobreaper/internal/asynqstate"
	"github.com/jobreaper/jobreaper/internal/idcheck"
	"github.com/jobreaper/jobreaper/internal/pgstore"
	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
	"github.com/jobreaper/jobreaper/reaper"
)

// B28: J28 is enqueued through the helper with a deadline 1 s away and
// MaxRetry(0) while the workers are busy for 3 s; asynq archives its task
// at dequeue without running the guard or the handler, and the row stays
// QUEUED. Another job's enqueue failed after its row was committed. After
// stale_queued_after both are reported (summary, per-queue metric, a
// warning with the count and their IDs) and left as they are; requeue
// --stale runs J28 again to completion through a worker with the guard and
// refuses the one without a task, exit 1.
func TestCase_B28_TaskArchivedBeforeAnyMiddlewareRan(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newRequeueFixture(t)
	j28, taskless := f.q+"-J28", f.q+"-never-enqueued"

	var mu sync.Mutex
	ran := map[string]int{}
	w := startWorker(t, f.db, f.rdb, f.q, "w-busy", func(ctx context.Context, _ *asynq.Task) error {
		id, _ := asynq.GetTaskID(ctx)
		mu.Lock()
		ran[id]++
		mu.Unlock()
		if strings.Contains(id, "-busy-") {
			time.Sleep(3 * time.Second) // the workers are busy
		}
		lease, err := jobs.LeaseFromContext(ctx)
		if err != nil {
			return err
		}
		_, err = f.store.CompleteWith(ctx, f.db.Pool, lease, nil)
		return err
	})
	t.Cleanup(w.srv.Shutdown)
	for i := range 4 { // the worker's Concurrency
		f.enqueue(t, f.q+"-busy-"+string(rune('a'+i)))
	}
	jobstest.Eventually(t, "the worker is busy", func() bool {
		tasks, err := f.insp.ListActiveTasks(f.q)
		return err == nil && len(tasks) == 4
	})
	f.enqueue(t, j28, asynq.Deadline(time.Now().Add(time.Second)), asynq.MaxRetry(0))
	jobstest.Eventually(t, "asynq archives T28 at dequeue", func() bool { return f.taskState(t, j28) == "archived" })
	f.db.Insert(t, jobstest.Job{ID: taskless, Type: "report.export", Status: jobs.StatusQueued, Queue: f.q})
	// An hour and more later.
	f.db.Exec(t, `UPDATE jobs SET updated_at = now() - interval '61 minutes' WHERE id IN ($1, $2)`, j28, taskless)
	before := map[string]jobstest.Row{j28: f.db.Read(t, j28), taskless: f.db.Read(t, taskless)}
	mu.Lock()
	ranBefore := ran[j28]
	mu.Unlock()
	if before[j28].Status != jobs.StatusQueued || ranBefore != 0 {
		t.Fatalf("J28 = %+v, handler runs %d; want QUEUED and never run", before[j28], ranBefore)
	}

	r := run(t, "run", "--once", "--output", "json", "--database-url", f.db.URL, "--schema", f.db.Schema,
		"--redis-url", e2eRedisURL, "--queues", f.q)
	requireExit(t, r, exitOK)
	var sum struct {
		StaleQueued int `json:"stale_queued"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &sum); err != nil || sum.StaleQueued != 2 {
		t.Fatalf("summary %s (%v): want stale_queued 2", r.stdout, err)
	}
	requireScannedAddsUp(t, r.stdout)
	if !strings.Contains(r.stderr, "stale QUEUED jobs") || !strings.Contains(r.stderr, "count=2") ||
		!strings.Contains(r.stderr, j28) || !strings.Contains(r.stderr, taskless) {
		t.Fatalf("no warning with the count and the job IDs:\n%s", r.stderr)
	}
	// The per-queue metric, from a daemon's pass.
	reg := prometheus.NewRegistry()
	markers := asynqstate.NewMarkerWriter(f.rdb, 0)
	lister, err := asynqstate.NewIDLister(f.rdb)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := reaper.New(f.db.Daemon(), lister, markers, reaper.Options{Queues: []string{f.q}, Metrics: reaper.NewMetrics(reg),
		Asynq: asynqstate.NewStatusReader(f.rdb, 0), Rule: pgstore.StallRule{DefaultStallTimeout: 15 * time.Minute, MinStallTimeout: 11 * time.Minute,
			DefaultHardTimeout: jobs.HardTimeoutDefault}}).RunOnce(ctx); err != nil {
		t.Fatal(err)
	}
	if got := gaugeValue(t, reg, "jobreaper_stale_queued_jobs", f.q); got != 2 {
		t.Fatalf("jobreaper_stale_queued_jobs{queue=%q} = %v, want 2", f.q, got)
	}
	for id, row := range before {
		if got := f.db.Read(t, id); got != row {
			t.Fatalf("%s changed by the passes: %+v -> %+v", id, row, got)
		}
	}

	r = run(t, f.args("--reason", "deadline passed while the workers were busy", "--stale", "--queues", f.q)...)
	requireExit(t, r, exitPassErrors)
	if !strings.Contains(r.stdout, "requeued "+idcheck.QuoteID(j28)+": QUEUED -> QUEUED at generation 1; its archived task") ||
		!strings.Contains(r.stdout, "refused "+idcheck.QuoteID(taskless)+": asynq holds no task for it") ||
		!strings.Contains(r.stdout, "the product must enqueue the job again") {
		t.Fatalf("requeue --stale printed:\n%s", r.stdout)
	}
	jobstest.Eventually(t, "J28 runs to completion", func() bool { return f.db.Read(t, j28).Status == jobs.StatusCompleted })
	mu.Lock()
	defer mu.Unlock()
	if ran[j28] != 1 {
		t.Fatalf("J28's handler ran %d times, want 1", ran[j28])
	}
	if got := f.db.Read(t, taskless); got != before[taskless] {
		t.Fatalf("the refused job changed: %+v -> %+v", before[taskless], got)
	}
}

// gaugeValue returns the value of gauge name{queue=q} in reg (0 if none).
func gaugeValue(t *testing.T, reg *prometheus.Registry, name, q string) float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "queue" && l.GetValue() == q {
					return m.GetGauge().GetValue()
				}
			}
		}
	}
	return 0
}
