package reaper_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jackc/pgx/v5"

	"github.com/jobreaper/jobreaper/internal/asynqstate"
	"github.com/jobreaper/jobreaper/internal/pgstore"
	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
	"github.com/jobreaper/jobreaper/queue"
	"github.com/jobreaper/jobreaper/reaper"
)

// retryWorld is a test's own Redis and schema with a real asynq server
// behind the start guard, running type "report.export" with a retry
// budget: each attempt's handler hangs (honouring its context, then tries
// its late Complete) while hang says so, and otherwise completes, writing
// one product row in the completion's transaction.
type retryWorld struct {
	o      *ownRedis
	store  *jobs.Store
	client *asynq.Client
	insp   *asynq.Inspector
	// hang says whether attempt n (1-based) of a job hangs.
	hang func(n int) bool

	mu       sync.Mutex
	attempts map[string]int
	late     map[string][]error
	running  chan int64 // the generation of each attempt that started
}

func newRetryWorld(t *testing.T, retries int, delay string, hang func(n int) bool) *retryWorld {
	t.Helper()
	o := newOwnRedis(t)
	o.db.Exec(t, `UPDATE job_types SET reap_retries = $1, reap_retry_delay = $2::interval WHERE name = 'report.export'`, retries, delay)
	o.db.Exec(t, `CREATE TABLE products (job_id text NOT NULL, generation bigint NOT NULL)`)
	o.db.Exec(t, `CREATE TABLE cascade_log (job_id text NOT NULL)`)
	w := &retryWorld{o: o, store: o.db.Store(), client: asynq.NewClientFromRedisClient(o.rc), insp: asynq.NewInspectorFromRedisClient(o.rc),
		hang: hang, attempts: map[string]int{}, late: map[string][]error{}, running: make(chan int64, 16)}
	markers, err := queue.NewMarkerStore(o.rc)
	if err != nil {
		t.Fatal(err)
	}
	mux := asynq.NewServeMux()
	mux.Use(queue.NewGuard(w.store, markers, queue.WithWorker("w1")).Middleware())
	mux.HandleFunc("report.export", func(ctx context.Context, _ *asynq.Task) error {
		lease, err := jobs.LeaseFromContext(ctx)
		if err != nil {
			return err
		}
		w.mu.Lock()
		w.attempts[lease.JobID]++
		n := w.attempts[lease.JobID]
		w.mu.Unlock()
		w.running <- lease.Generation
		hung := w.hang(n)
		if hung {
			<-ctx.Done() // the hung external call, which honours its context
		}
		_, err = w.store.CompleteWith(context.WithoutCancel(ctx), o.db.Pool, lease, func(tx pgx.Tx) error {
			_, err := tx.Exec(context.WithoutCancel(ctx), `INSERT INTO products VALUES ($1, $2)`, lease.JobID, lease.Generation)
			return err
		})
		if hung {
			w.mu.Lock()
			w.late[lease.JobID] = append(w.late[lease.JobID], err)
			w.mu.Unlock()
		}
		return err
	})
	srv := asynq.NewServerFromRedisClient(o.rc, asynq.Config{
		Queues: map[string]int{"q": 1}, Concurrency: 2, ShutdownTimeout: 300 * time.Millisecond,
		LogLevel: asynq.FatalLevel, IsFailure: queue.IsFailure,
		RetryDelayFunc: func(int, error, *asynq.Task) time.Duration { return 200 * time.Millisecond },
	})
	if err := srv.Start(mux); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	waitLive(t, o.rc, "q")
	return w
}

// reaper returns a daemon's Reaper on the world, cancel on reap off;
// canceller, when not nil, replaces the retry canceller.
func (w *retryWorld) reaper(t *testing.T, canceller reaper.Canceller) *reaper.Reaper {
	t.Helper()
	lister, err := asynqstate.NewIDLister(w.o.rc)
	if err != nil {
		t.Fatal(err)
	}
	opts := reaper.Options{Rule: baselineRule, Metrics: w.o.metrics, Logger: testLogger(t),
		Asynq:          asynqstate.NewStatusReader(w.o.rc, 0),
		Interval:       200 * time.Millisecond, // a retry reap settles for one interval
		RetryCanceller: asynqstate.NewCanceller(w.o.rc, 0),
		Replacer:       asynqstate.NewRetryReplacer(w.o.rc, w.o.db.Daemon())}
	if canceller != nil {
		opts.RetryCanceller = canceller
	}
	cascades := jobs.Cascades{"report.export": {OnFailed: []string{`INSERT INTO cascade_log VALUES (@job_id)`}}}
	return reaper.New(w.o.db.Daemon(pgstore.WithCascades(cascades)), lister, w.o.markers, opts)
}

// enqueue inserts job id QUEUED and enqueues its task with opts.
func (w *retryWorld) enqueue(t *testing.T, id string, opts ...asynq.Option) {
	t.Helper()
	w.o.db.Insert(t, jobstest.Job{ID: id, Type: "report.export", Status: jobs.StatusQueued, Queue: "q"})
	if _, err := queue.Enqueue(t.Context(), w.client, w.store, asynq.NewTask("report.export", []byte("payload")), id, opts...); err != nil {
		t.Fatal(err)
	}
}

// started waits for the next attempt to start and returns its generation.
func (w *retryWorld) started(t *testing.T) int64 {
	t.Helper()
	select {
	case g := <-w.running:
		return g
	case <-time.After(30 * time.Second):
		t.Fatal("no attempt started within 30s")
		return 0
	}
}

// stall makes the running attempt of id look stalled.
func (w *retryWorld) stall(t *testing.T, id string) {
	w.o.db.Exec(t, `UPDATE jobs SET started_at = now() - interval '31 minutes', updated_at = now() - interval '21 minutes' WHERE id = $1`, id)
}

func (w *retryWorld) pass(t *testing.T, r *reaper.Reaper) reaper.Result {
	t.Helper()
	res, err := runOnce(t, t.Context(), r)
	if err != nil || res.Errors != 0 {
		t.Fatalf("pass: %+v, %v", res, err)
	}
	return res
}

func (w *retryWorld) lateResults(id string) []error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]error(nil), w.late[id]...)
}

func TestRetryReap(t *testing.T) {
	t.Parallel()

	t.Run("AJobHangingTwiceRunsAThirdTimeAndCompletes", func(t *testing.T) {
		t.Parallel()
		w := newRetryWorld(t, 2, "1 second", func(n int) bool { return n <= 2 })
		r := w.reaper(t, nil)
		w.enqueue(t, "J1")
		for i := 1; i <= 2; i++ {
			w.started(t)
			w.stall(t, "J1")
			res := w.pass(t, r)
			if res.Reaped != 1 || res.RetriedBy[jobs.ReasonStalled] != 1 {
				t.Fatalf("reap %d: %+v, want one retry reap", i, res)
			}
		}
		if g := w.started(t); g != 5 {
			t.Fatalf("the third attempt runs at generation %d, want 5", g)
		}
		jobstest.Eventually(t, "J1 completed", func() bool { return w.o.db.Read(t, "J1").Status == jobs.StatusCompleted })
		jobstest.Eventually(t, "both hung attempts' late writes refused", func() bool { return len(w.lateResults("J1")) == 2 })
		for _, err := range w.lateResults("J1") {
			if !errors.Is(err, jobs.ErrStaleWorker) {
				t.Errorf("a hung attempt's late Complete = %v, want ErrStaleWorker", err)
			}
		}
		db := w.o.db
		if n := db.Count(t, `SELECT count(*) FROM job_events WHERE job_id = 'J1' AND kind = 'reaped' AND detail->>'retry' = 'true'`); n != 2 {
			t.Fatalf("%d retry reaped events, want 2", n)
		}
		if n := len(db.LateResults(t, "J1")); n != 2 {
			t.Fatalf("%d late_result_rejected events, want 2", n)
		}
		if n := db.Count(t, `SELECT count(*) FROM cascade_log`); n != 0 {
			t.Fatalf("the on_failed cascade ran %d times, want never", n)
		}
		if n := db.Count(t, `SELECT count(*) FROM products WHERE job_id = 'J1'`); n != 1 {
			t.Fatalf("%d product rows, want 1", n)
		}
		if n := db.Count(t, `SELECT count(*) FROM jobs WHERE id = 'J1' AND reap_count = 2 AND marker_set_at IS NULL`); n != 1 {
			t.Fatalf("row %+v, want reap_count 2 and no marker recorded", db.Read(t, "J1"))
		}
		if n := w.o.rc.Exists(t.Context(), queue.MarkerKey("J1")).Val(); n != 0 {
			t.Fatal("a retry reap wrote a marker")
		}
		if got := metricValue(t, w.o.reg, "jobreaper_jobs_retried_after_reap_total", map[string]string{"reason": "stalled", "type": "report.export", "queue": "q"}); got != 2 {
			t.Fatalf("jobreaper_jobs_retried_after_reap_total = %v, want 2", got)
		}
		if got := metricValue(t, w.o.reg, "jobreaper_jobs_reaped_total", map[string]string{"reason": "stalled", "type": "report.export", "queue": "q"}); got != 2 {
			t.Fatalf("jobreaper_jobs_reaped_total = %v, want 2", got)
		}
	})

	t.Run("AJobHangingThreeTimesFailsAtTheThirdReap", func(t *testing.T) {
		t.Parallel()
		w := newRetryWorld(t, 2, "1 second", func(int) bool { return true })
		r := w.reaper(t, nil)
		w.enqueue(t, "J1")
		for i := 1; i <= 3; i++ {
			w.started(t)
			w.stall(t, "J1")
			res := w.pass(t, r)
			if want := min(1, 3-i); res.Reaped != 1 || res.RetriedBy[jobs.ReasonStalled] != want {
				t.Fatalf("reap %d: %+v, want one reap, %d of them a retry", i, res, want)
			}
		}
		db := w.o.db
		if row := db.Read(t, "J1"); row.Status != jobs.StatusFailed || row.FailureReason != jobs.ReasonStalled || row.Generation != 5 {
			t.Fatalf("row %+v, want FAILED stalled at generation 5", row)
		}
		if g, ok, err := w.o.markers.Get(t.Context(), "J1"); err != nil || !ok || g != 5 {
			t.Fatalf("marker %d %v %v, want generation 5", g, ok, err)
		}
		if n := db.Count(t, `SELECT count(*) FROM job_events WHERE job_id = 'J1' AND kind = 'reaped'`); n != 3 {
			t.Fatalf("%d reaped events, want 3", n)
		}
		if n := db.Count(t, `SELECT count(*) FROM cascade_log WHERE job_id = 'J1'`); n != 1 {
			t.Fatalf("the on_failed cascade ran %d times, want once", n)
		}
		if n := db.Count(t, `SELECT count(*) FROM products`); n != 0 {
			t.Fatalf("%d product rows, want none", n)
		}
	})

	t.Run("ALostJobWhoseTaskWasArchivedRunsAgainAfterTheDelay", func(t *testing.T) {
		t.Parallel()
		w := newRetryWorld(t, 1, "1 second", func(int) bool { return false })
		r := w.reaper(t, nil)
		db := w.o.db
		stalledRows(t, db, "q", time.Hour, "J1")
		if _, err := w.client.EnqueueContext(t.Context(), asynq.NewTask("report.export", []byte("payload")), asynq.TaskID("J1"), asynq.Queue("q"),
			asynq.ProcessIn(time.Hour)); err != nil {
			t.Fatal(err)
		}
		if err := w.insp.ArchiveTask("q", "J1"); err != nil {
			t.Fatal(err)
		}
		res := w.pass(t, r)
		if res.Reaped != 1 || res.RetriedBy[jobs.ReasonLostTask] != 1 {
			t.Fatalf("pass: %+v, want one lost_task retry reap", res)
		}
		info, err := w.insp.GetTaskInfo("q", "J1")
		if err != nil || info.State != asynq.TaskStateScheduled || string(info.Payload) != "payload" {
			t.Fatalf("task after the retry reap: %+v, %v; want it scheduled with its payload", info, err)
		}
		if d := time.Until(info.NextProcessAt); d < 0 || d > 1100*time.Millisecond {
			t.Fatalf("the task runs in %v, want within reap_retry_delay (1s)", d)
		}
		if g := w.started(t); g != 3 {
			t.Fatalf("the retry runs at generation %d, want 3", g)
		}
		jobstest.Eventually(t, "J1 completed", func() bool { return db.Read(t, "J1").Status == jobs.StatusCompleted })
		if n := db.Count(t, `SELECT count(*) FROM jobs WHERE id = 'J1' AND reap_count = 1`); n != 1 {
			t.Fatal("reap_count is not 1")
		}
	})

	t.Run("AStalledRetryOfALastDeliveryIsReenqueuedByALaterPass", func(t *testing.T) {
		t.Parallel()
		w := newRetryWorld(t, 1, "100 milliseconds", func(n int) bool { return n == 1 })
		r := w.reaper(t, nil)
		w.enqueue(t, "J1", asynq.MaxRetry(0))
		w.started(t)
		w.stall(t, "J1")
		if res := w.pass(t, r); res.RetriedBy[jobs.ReasonStalled] != 1 {
			t.Fatalf("pass: %+v, want one retry reap", res)
		}
		jobstest.Eventually(t, "asynq archived the cancelled last delivery", func() bool {
			info, err := w.insp.GetTaskInfo("q", "J1")
			return err == nil && info.State == asynq.TaskStateArchived
		})
		var finished int
		jobstest.Eventually(t, "a later pass re-enqueued it", func() bool {
			finished += w.pass(t, r).RetriesFinished[reaper.RetryReenqueued]
			return finished == 1
		})
		w.started(t)
		jobstest.Eventually(t, "J1 completed", func() bool { return w.o.db.Read(t, "J1").Status == jobs.StatusCompleted })
		if got := metricValue(t, w.o.reg, "jobreaper_reap_retries_finished_total", map[string]string{"action": reaper.RetryReenqueued}); got != 1 {
			t.Fatalf("jobreaper_reap_retries_finished_total{reenqueued} = %v, want 1", got)
		}
	})

	t.Run("ADroppedCancelIsSentAgain", func(t *testing.T) {
		t.Parallel()
		w := newRetryWorld(t, 1, "1 second", func(n int) bool { return n == 1 })
		drop := &droppingCanceller{next: asynqstate.NewCanceller(w.o.rc, 0)}
		drop.drops.Store(1)
		r := w.reaper(t, drop)
		w.enqueue(t, "J1")
		w.started(t)
		w.stall(t, "J1")
		if res := w.pass(t, r); res.RetriedBy[jobs.ReasonStalled] != 1 {
			t.Fatalf("pass: %+v, want one retry reap", res)
		}
		var resent int
		jobstest.Eventually(t, "a later pass sent the cancel again", func() bool {
			resent += w.pass(t, r).RetriesFinished[reaper.RetryCancelResent]
			return resent >= 1
		})
		if g := w.started(t); g != 3 {
			t.Fatalf("the retry runs at generation %d, want 3", g)
		}
		jobstest.Eventually(t, "J1 completed", func() bool { return w.o.db.Read(t, "J1").Status == jobs.StatusCompleted })
	})
}

// droppingCanceller drops its first drops calls (an at-most-once publish
// nobody received), then passes the cancels on.
type droppingCanceller struct {
	next  reaper.Canceller
	drops atomic.Int64
}

func (d *droppingCanceller) Cancel(ctx context.Context, ids []string) (int, error) {
	if d.drops.Add(-1) >= 0 {
		return len(ids), nil
	}
	return d.next.Cancel(ctx, ids)
}

// The mass-loss limit counts retry reaps like reaps: two lost jobs whose
// tasks asynq archived, of a type with budget left, are more than
// max_lost_per_pass 1, so neither is retried.
func TestRetryReap_MassLossLimitCountsRetries(t *testing.T) {
	t.Parallel()
	o := newOwnRedis(t)
	o.db.Exec(t, `UPDATE job_types SET reap_retries = 1 WHERE name = 'report.export'`)
	serve(t, o.rc, []string{"q"}, func(context.Context, *asynq.Task) error { return nil }, asynq.Config{})
	waitLive(t, o.rc, "q")
	stalledRows(t, o.db, "q", time.Hour, "L1", "L2")
	archived(t, o.rc, "q", "L1")
	archived(t, o.rc, "q", "L2")
	r := o.lostReaper(t, o.rc, func(opts *reaper.Options) {
		opts.Queues = []string{"q"}
		opts.MaxLostPerPass = 1
		opts.Replacer = asynqstate.NewRetryReplacer(o.rc, o.db.Daemon())
	})
	res, _ := runOnce(t, t.Context(), r)
	if !res.LostLimitTripped || res.Reaped != 0 || res.RetriedBy[jobs.ReasonLostTask] != 0 {
		t.Fatalf("pass = %+v, want the limit tripped and nothing retried", res)
	}
	if n := o.db.Count(t, `SELECT count(*) FROM jobs WHERE status = 'PROCESSING' AND generation = 1`); n != 2 {
		t.Fatalf("%d of 2 rows untouched", n)
	}
}
