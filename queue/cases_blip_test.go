package queue

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
)

// blipWorker is B49's five handlers, told apart by job ID. Each one's first
// run reports its arrival and waits for the test to cut the worker's
// PostgreSQL connection; then it returns (or completes) during the cut.
type blipWorker struct {
	store   *jobs.Store
	arrived chan string
	release chan struct{}

	mu   sync.Mutex
	runs map[string]int
	errs []error
}

func (w *blipWorker) run(id string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.runs[id]++
	return w.runs[id]
}

func (w *blipWorker) count(id string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.runs[id]
}

func (w *blipWorker) fail(err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.errs = append(w.errs, err)
}

// complete is a CompleteWith writing the job's product row.
func (w *blipWorker) complete(ctx context.Context, lease jobs.Lease) error {
	_, err := w.store.CompleteWith(ctx, nil, lease, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO products (job_id) VALUES ($1)`, lease.JobID)
		return err
	})
	return err
}

func (w *blipWorker) ProcessTask(ctx context.Context, _ *asynq.Task) error {
	lease, err := jobs.LeaseFromContext(ctx)
	if err != nil {
		w.fail(err)
		return err
	}
	id := lease.JobID
	if w.run(id) > 1 {
		if id != "retry" {
			w.fail(fmt.Errorf("job %s ran again (generation %d)", id, lease.Generation))
		}
		return w.complete(ctx, lease) // the retried attempt completes
	}
	if id == "done" {
		// Completed before the cut; it returns nil during it.
		if err := w.complete(ctx, lease); err != nil {
			w.fail(fmt.Errorf("completing %s before the cut: %w", id, err))
			return err
		}
	}
	w.arrived <- id
	<-w.release
	switch id {
	case "last":
		return Failure("upstream_down", errors.New("the upstream answered 503"))
	case "retry":
		return errors.New("the upstream answered 503 once")
	case "complete":
		if err := w.complete(ctx, lease); err != nil {
			w.fail(fmt.Errorf("completing %s through the blip: %w", id, err))
			return err
		}
	}
	return nil // "auto" and "done"
}

// TestCase_B49_AFinalizationWriteMeetsATwoSecondBlip: a real asynq server
// runs five handlers through the real guard; the worker's PostgreSQL pool
// is cut (connections refused, open ones closed) for 2 s while they
// return: an error on the last attempt, an error with retries left, a
// CompleteWith that cannot connect, nil on an auto_complete type, nil after
// a confirmed completion. Each job ends as its handler said: FAILED with
// the handler's code, released (QUEUED) then retried and COMPLETED,
// COMPLETED by the retried completion, COMPLETED by auto-complete,
// COMPLETED. None is left PROCESSING for the reaper (so none could become
// lost_task or stalled), the guard records no settle_failed, and no
// handler that completed runs again. The daemon keeps its connection.
func TestCase_B49_AFinalizationWriteMeetsATwoSecondBlip(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := jobstest.New(t)
	db.JobType(t, "blip.plain", "30 minutes", "", "")
	db.JobType(t, "blip.auto", "30 minutes", "", "")
	db.Exec(t, `UPDATE job_types SET auto_complete = true WHERE name = 'blip.auto'`)
	db.Exec(t, `CREATE TABLE products (job_id text NOT NULL)`)
	cut := db.Cuttable(t)
	store := jobs.NewStore(cut.Pool, jobs.WithSchema(db.Schema))
	rc := realRedis(t)
	q := unique(t, "b49-")
	deleteQueueAtCleanup(t, rc, q)
	markers, err := NewMarkerStore(rc)
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	w := &blipWorker{store: store, arrived: make(chan string, 5), release: make(chan struct{}), runs: map[string]int{}}
	mux := asynq.NewServeMux()
	mux.Use(NewGuard(store, markers, WithWorker("W1"), WithLogger(testLogger(t)), WithRegisterer(reg)).Middleware())
	mux.Handle("blip.plain", w)
	mux.Handle("blip.auto", w)
	startServer(t, rc, q, asynq.Config{
		IsFailure: IsFailure, Concurrency: 5,
		// The released job's retry comes at once (asynq's default waits
		// 15 s and more), and retries are moved to the queue every 100 ms.
		RetryDelayFunc:           func(int, error, *asynq.Task) time.Duration { return 100 * time.Millisecond },
		DelayedTaskCheckInterval: 100 * time.Millisecond,
	}, mux)

	client := asynq.NewClientFromRedisClient(rc)
	t.Cleanup(func() { _ = client.Close() })
	for _, j := range []struct {
		id, typ  string
		maxRetry int
	}{
		{"last", "blip.plain", 0}, {"retry", "blip.plain", 3}, {"complete", "blip.plain", 3},
		{"auto", "blip.auto", 3}, {"done", "blip.plain", 3},
	} {
		db.Insert(t, jobstest.Job{ID: j.id, Type: j.typ, Status: jobs.StatusQueued, Queue: q})
		if _, err := Enqueue(ctx, client, db.Store(), asynq.NewTask(j.typ, nil), j.id, asynq.MaxRetry(j.maxRetry)); err != nil {
			t.Fatalf("enqueueing %s: %v", j.id, err)
		}
	}
	deadline := time.After(30 * time.Second)
	for range 5 {
		select {
		case <-w.arrived:
		case <-deadline:
			t.Fatal("the five handlers did not all start within 30 s")
		}
	}

	// The blip: the worker's connections are refused for 2 s while every
	// handler returns.
	cut.Cut()
	blipStart := time.Now()
	restore := time.AfterFunc(2*time.Second, cut.Restore)
	t.Cleanup(func() { restore.Stop() })
	close(w.release)

	insp := asynq.NewInspectorFromRedisClient(rc)
	settledAll := func() bool {
		for _, want := range []struct{ id, status, reason string }{
			{"last", jobs.StatusFailed, "upstream_down"}, {"retry", jobs.StatusCompleted, ""},
			{"complete", jobs.StatusCompleted, ""}, {"auto", jobs.StatusCompleted, ""}, {"done", jobs.StatusCompleted, ""},
		} {
			if r := db.Read(t, want.id); r.Status != want.status || r.FailureReason != want.reason {
				return false
			}
		}
		qi, err := insp.GetQueueInfo(q)
		return err == nil && qi.Pending+qi.Active+qi.Scheduled+qi.Retry == 0
	}
	for !settledAll() {
		select {
		case <-deadline:
			for _, id := range []string{"last", "retry", "complete", "auto", "done"} {
				t.Logf("job %s: %+v", id, db.Read(t, id))
			}
			t.Fatal("the jobs did not end as their handlers said within 30 s")
		case <-time.After(50 * time.Millisecond):
		}
	}
	if cut.Refused() == 0 {
		t.Fatal("no connection was refused: the blip did not meet a finalization write")
	}
	t.Logf("every job settled %s after the blip began", time.Since(blipStart).Round(time.Millisecond))

	w.mu.Lock()
	errs := w.errs
	w.mu.Unlock()
	if len(errs) > 0 {
		t.Fatalf("handlers reported: %v", errs)
	}
	for id, want := range map[string]int{"last": 1, "retry": 2, "complete": 1, "auto": 1, "done": 1} {
		if n := w.count(id); n != want {
			t.Errorf("job %s ran %d times, want %d", id, n, want)
		}
	}
	// The job with retries left went back to QUEUED: a released event of
	// its first attempt, then the second attempt's completion.
	requireCount := func(want int64, sql string, args ...any) {
		t.Helper()
		if n := db.Count(t, sql, args...); n != want {
			t.Errorf("%s %v = %d, want %d", sql, args, n, want)
		}
	}
	requireCount(1, `SELECT count(*) FROM job_events WHERE job_id = 'retry' AND kind = 'released' AND generation = 1`)
	requireCount(1, `SELECT count(*) FROM job_events WHERE job_id = 'retry' AND kind = 'completed' AND generation = 2`)
	requireCount(1, `SELECT count(*) FROM job_events WHERE job_id = 'auto' AND kind = 'completed' AND detail->>'auto_complete' = 'true'`)
	requireCount(1, `SELECT count(*) FROM job_events WHERE job_id = 'last' AND kind = 'failed' AND detail->>'code' = 'upstream_down'`)
	requireCount(0, `SELECT count(*) FROM job_events WHERE kind = 'late_result_rejected'`)
	for _, id := range []string{"retry", "complete", "done"} {
		requireCount(1, `SELECT count(*) FROM products WHERE job_id = $1`, id)
	}
	decisions := newGuardMetrics(reg).decisions
	for d, want := range map[string]float64{"settle_failed": 0, "failed": 1, "released": 1, "auto_completed": 1, "claimed": 6} {
		if v := testutil.ToFloat64(decisions.WithLabelValues(d)); v != want {
			t.Errorf("jobreaper_guard_decisions_total{decision=%q} = %v, want %v", d, v, want)
		}
	}
}
