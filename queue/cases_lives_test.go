package queue

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/jobreaper/jobreaper/internal/pgstore"
	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
)

// pageRun is what one handler run of pageWorker saw.
type pageRun struct {
	lease    jobs.Lease
	replayed int
	err      error
}

// pageWorker is the report handler of B32: three batches of 10 items
// through Advance (tokens page-1 to page-3), each writing its items in the
// batch's transaction unless replayed, then CompleteWith. With hangAfter
// set, its first run stops after that page until release closes, then
// fails, as a hung export call would.
type pageWorker struct {
	db        *jobstest.DB
	store     *jobs.Store
	hangAfter int
	hung      chan struct{}
	release   chan struct{}
	runs      chan pageRun

	mu    sync.Mutex
	count int
}

func newPageWorker(db *jobstest.DB, store *jobs.Store, hangAfter int) *pageWorker {
	return &pageWorker{db: db, store: store, hangAfter: hangAfter,
		hung: make(chan struct{}), release: make(chan struct{}), runs: make(chan pageRun, 4)}
}

func (w *pageWorker) ProcessTask(ctx context.Context, _ *asynq.Task) error {
	w.mu.Lock()
	w.count++
	first := w.count == 1
	w.mu.Unlock()
	run := pageRun{}
	run.lease, run.err = jobs.LeaseFromContext(ctx)
	defer func() { w.runs <- run }()
	if run.err != nil {
		return run.err
	}
	for p := 1; p <= 3; p++ {
		if run.err = w.page(ctx, &run, p); run.err != nil {
			return run.err
		}
		if first && p == w.hangAfter {
			close(w.hung)
			<-w.release
			run.err = errors.New("the export call finally failed")
			return run.err
		}
	}
	_, run.err = w.store.CompleteWith(ctx, w.db.Pool, run.lease, nil)
	return run.err
}

func (w *pageWorker) page(ctx context.Context, run *pageRun, p int) error {
	tx, err := w.db.Pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	res, err := w.store.Advance(ctx, tx, run.lease, fmt.Sprintf("page-%d", p), int64(10*(p-1)), 10)
	if err != nil {
		return err
	}
	if res.Replayed {
		run.replayed++
	} else if _, err := tx.Exec(ctx, `INSERT INTO items (job_id, n) SELECT $1, g FROM generate_series($2::int, $2::int + 9) g`,
		run.lease.JobID, 10*(p-1)); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

func (w *pageWorker) next(t *testing.T) pageRun {
	t.Helper()
	select {
	case r := <-w.runs:
		return r
	case <-time.After(10 * time.Second):
		t.Fatal("no handler run within 10s")
	}
	return pageRun{}
}

// TestCase_B32_JobIDUsedASecondTime: the product uses a deterministic ID;
// job R writes 3 pages of 10 items and completes (or, in the second
// variant, is reaped, its marker at generation 1 still in Redis two days
// later). The product deletes R's row and its items and inserts R again as
// QUEUED, and enqueues it through the helper while asynq still holds the
// first life's completed or archived task. The new R writes its 3 pages (30
// items, cursor 30) without a single Replayed answer, and completes; its
// fencing token and idempotency key differ from the first life's. Real
// PostgreSQL, Redis and asynq.
func TestCase_B32_JobIDUsedASecondTime(t *testing.T) {
	t.Parallel()
	for _, variant := range []struct {
		name   string
		reaped bool
	}{{"CompletedThenDeletedAndInsertedAgain", false}, {"ReapedTwoDaysEarlierWithItsMarkerStillSet", true}} {
		t.Run(variant.name, func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			db := jobstest.New(t)
			db.JobType(t, "report.export", "30 minutes", "", "")
			db.Exec(t, `CREATE TABLE items (job_id text NOT NULL, n int NOT NULL)`)
			store := db.Store()
			rc := realRedis(t)
			q := unique(t, "b32-")
			deleteQueueAtCleanup(t, rc, q)
			id := unique(t, "report:tenant42:2026-11-30:")
			t.Cleanup(func() { rc.Del(context.Background(), MarkerKey(id)) })
			markers, err := NewMarkerStore(rc)
			if err != nil {
				t.Fatal(err)
			}
			insp := asynq.NewInspectorFromRedisClient(rc)
			enq := NewEnqueuer(rc, store)
			hangAfter := 0
			if variant.reaped {
				hangAfter = 1
			}
			w := newPageWorker(db, store, hangAfter)
			defer close(w.release)
			mux := asynq.NewServeMux()
			mux.Use(NewGuard(store, markers, WithWorker("W1"), WithLogger(testLogger(t))).Middleware())
			mux.Handle("report.export", w)
			startServer(t, rc, q, asynq.Config{IsFailure: IsFailure, Concurrency: 1}, mux)

			insertR := func() {
				db.Insert(t, jobstest.Job{ID: id, Type: "report.export", Status: jobs.StatusQueued, Queue: q, Total: ptr[int64](30)})
			}
			taskState := func(want asynq.TaskState) func() bool {
				return func() bool {
					info, err := insp.GetTaskInfo(q, id)
					return err == nil && info.State == want
				}
			}
			task := asynq.NewTask("report.export", nil)
			retention := asynq.Retention(24 * time.Hour) // asynq keeps the completed task, as products often ask

			// First life.
			insertR()
			if _, err := enq.Enqueue(ctx, task, id, retention); err != nil {
				t.Fatalf("enqueueing the first life: %v", err)
			}
			var first pageRun
			if variant.reaped {
				<-w.hung
				db.Exec(t, `UPDATE jobs SET started_at = now() - interval '40 minutes', updated_at = now() - interval '20 minutes' WHERE id = $1`, id)
				reaped, ev, err := db.Daemon().Reap(ctx, pgstore.ReapParams{JobID: id, Generation: 1, UpdatedAt: db.Read(t, id).UpdatedAt,
					Reason: jobs.ReasonStalled, Rule: pgstore.StallRule{DefaultStallTimeout: 15 * time.Minute, MinStallTimeout: 11 * time.Minute, DefaultHardTimeout: 24 * time.Hour}})
				if err != nil || !reaped || ev.Generation != 1 {
					t.Fatalf("reaping the first life: reaped %v, generation %d, err %v", reaped, ev.Generation, err)
				}
				// The reap was two days ago: 5 of the marker's 7 days are left.
				if set, err := writeMarker(ctx, markers, id, 1, MarkerTTL-48*time.Hour); err != nil || !set {
					t.Fatalf("setting the marker: set %v, err %v", set, err)
				}
				w.release <- struct{}{}
				first = w.next(t)
				jobstest.Eventually(t, "asynq archives the reaped first life's task", taskState(asynq.TaskStateArchived))
			} else {
				first = w.next(t)
				if first.err != nil {
					t.Fatalf("first life: %v", first.err)
				}
				jobstest.Eventually(t, "asynq keeps the first life's completed task", taskState(asynq.TaskStateCompleted))
			}
			requireRow(t, db, id, map[bool]string{false: jobs.StatusCompleted, true: jobs.StatusFailed}[variant.reaped], 1)

			// "Run this report again": the product deletes the row and its
			// items, and inserts R again.
			db.Exec(t, `DELETE FROM items WHERE job_id = $1`, id)
			db.Exec(t, `DELETE FROM jobs WHERE id = $1`, id)
			insertR()
			if r := db.Read(t, id); r.Generation != 2 || r.FirstGeneration != 2 {
				t.Fatalf("R inserted again = %+v, want its generation to start above the first life's 1", r)
			}
			// The plain helper has no Inspector: it refuses, and says why.
			_, err = Enqueue(ctx, asynq.NewClientFromRedisClient(rc), store, task, id)
			if !errors.Is(err, asynq.ErrTaskIDConflict) || !strings.Contains(err.Error(), "queue.Enqueuer") {
				t.Fatalf("queue.Enqueue of the second life: %v, want a task ID conflict pointing to queue.Enqueuer", err)
			}
			if _, err := enq.Enqueue(ctx, task, id, retention); err != nil {
				t.Fatalf("enqueueing the second life: %v", err)
			}

			second := w.next(t)
			if second.err != nil {
				t.Fatalf("second life: %v", second.err)
			}
			if second.replayed != 0 {
				t.Fatalf("%d of the second life's Advance calls were answered Replayed", second.replayed)
			}
			jobstest.Eventually(t, "asynq completes the second life's task", taskState(asynq.TaskStateCompleted))
			r := requireRow(t, db, id, jobs.StatusCompleted, 3)
			if r.Cursor != 30 || r.FirstGeneration != 2 {
				t.Fatalf("second life's row = %+v, want cursor 30 in the life that started at 2", r)
			}
			if n := db.Count(t, `SELECT count(*) FROM items WHERE job_id = $1`, id); n != 30 {
				t.Fatalf("items of the second life = %d, want 30", n)
			}
			if a, b := first.lease.FencingToken(), second.lease.FencingToken(); a == b || a != id+":1" || b != id+":3" {
				t.Fatalf("fencing tokens %q and %q, want %s:1 and %s:3", a, b, id, id)
			}
			if a, b := first.lease.IdempotencyKey("charge"), second.lease.IdempotencyKey("charge"); a == b || a != id+":charge" || b != id+"@2:charge" {
				t.Fatalf("idempotency keys %q and %q, want %s:charge and %s@2:charge", a, b, id, id)
			}
			if variant.reaped {
				if g, found, err := markers.Get(ctx, id); err != nil || !found || g != 1 {
					t.Fatalf("marker = %d (found %v, err %v), want the first life's 1 still there: it did not refuse the second life", g, found, err)
				}
			}
		})
	}
}

// The enqueue helper removes an earlier life's task only when asynq will
// never run it and the row has not been claimed in its life: a pending
// task of the ID is left alone, and so is an archived task of a row that
// was claimed in its life (a requeue, which keeps its life).
func TestEnqueuerRemovesOnlyWhatNoLifeNeeds(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	rc := realRedis(t)
	q := unique(t, "lives-")
	deleteQueueAtCleanup(t, rc, q)
	b := setupEnqueue(t, rc)
	enq := NewEnqueuer(rc, b.store)
	task := asynq.NewTask("report.export", nil)

	pending := unique(t, "pending-")
	b.db.Insert(t, jobstest.Job{ID: pending, Type: "report.export", Status: jobs.StatusQueued, Queue: q})
	if _, err := enq.Enqueue(ctx, task, pending); err != nil {
		t.Fatal(err)
	}
	_, err := enq.Enqueue(ctx, task, pending)
	if !errors.Is(err, asynq.ErrTaskIDConflict) || !strings.Contains(err.Error(), "pending") {
		t.Fatalf("second Enqueue of a pending task: %v, want a conflict naming the pending state", err)
	}
	if info, err := b.insp.GetTaskInfo(q, pending); err != nil || info.State != asynq.TaskStatePending {
		t.Fatalf("the pending task = %+v (%v), want it kept", info, err)
	}

	// Requeued by hand (generation + 1, as docs/operating.md says) after a reap: the
	// archived task is this life's, and stays until the operator acts.
	requeued := unique(t, "requeued-")
	b.db.Insert(t, jobstest.Job{ID: requeued, Type: "report.export", Status: jobs.StatusQueued, Queue: q})
	if _, err := enq.Enqueue(ctx, task, requeued); err != nil {
		t.Fatal(err)
	}
	if err := b.insp.ArchiveTask(q, requeued); err != nil {
		t.Fatal(err)
	}
	b.db.Exec(t, `UPDATE jobs SET generation = 2 WHERE id = $1`, requeued) // claimed once, reaped, requeued
	_, err = enq.Enqueue(ctx, task, requeued)
	if !errors.Is(err, asynq.ErrTaskIDConflict) {
		t.Fatalf("Enqueue of a requeued job whose task is archived: %v, want a task ID conflict", err)
	}
	if info, err := b.insp.GetTaskInfo(q, requeued); err != nil || info.State != asynq.TaskStateArchived {
		t.Fatalf("the requeued job's archived task = %+v (%v), want it kept", info, err)
	}

	// A row never claimed whose task asynq archived (the guard could not
	// decide on the task's last delivery): the task never ran, so it is
	// replaced.
	unrun := unique(t, "unrun-")
	b.db.Insert(t, jobstest.Job{ID: unrun, Type: "report.export", Status: jobs.StatusQueued, Queue: q})
	if _, err := enq.Enqueue(ctx, task, unrun); err != nil {
		t.Fatal(err)
	}
	if err := b.insp.ArchiveTask(q, unrun); err != nil {
		t.Fatal(err)
	}
	if _, err := enq.Enqueue(ctx, task, unrun); err != nil {
		t.Fatalf("Enqueue of a never-claimed row whose task was archived: %v", err)
	}
	if info, err := b.insp.GetTaskInfo(q, unrun); err != nil || info.State != asynq.TaskStatePending {
		t.Fatalf("the replaced task = %+v (%v), want pending", info, err)
	}
}
