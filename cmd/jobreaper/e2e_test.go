package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
	"github.com/jobreaper/jobreaper/queue"
	"github.com/jobreaper/jobreaper/queue/queuetest"
)

// e2eRedisURL is the real Redis the end-to-end test runs asynq on.
const e2eRedisURL = "redis://127.0.0.1:6379/0"

// e2eRedis returns a client of the real Redis, closed at cleanup; it fails
// the test (never skips it) when Redis does not answer.
func e2eRedis(t *testing.T) *redis.Client {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	t.Cleanup(func() { _ = rdb.Close() })
	if err := rdb.Ping(t.Context()).Err(); err != nil {
		t.Fatalf("Redis for tests is not reachable at 127.0.0.1:6379 (%v); start it (bash .ci/test starts it)", err)
	}
	return rdb
}

// worker is a real asynq Server with the start guard in front of handler.
type worker struct {
	srv *asynq.Server
}

func startWorker(t *testing.T, db *jobstest.DB, rdb *redis.Client, q, name string, handler asynq.HandlerFunc) *worker {
	t.Helper()
	markers, err := queue.NewMarkerStore(rdb)
	if err != nil {
		t.Fatal(err)
	}
	guard := queue.NewGuard(db.Store(), markers, queue.WithWorker(name))
	srv := asynq.NewServerFromRedisClient(rdb, asynq.Config{
		Queues:          map[string]int{q: 1},
		Concurrency:     4,
		ShutdownTimeout: 300 * time.Millisecond,
		LogLevel:        asynq.FatalLevel,
		IsFailure:       queue.IsFailure,
	})
	mux := asynq.NewServeMux()
	mux.Use(guard.Middleware())
	// One handler for every job type of these tests.
	for _, typ := range []string{"report.export", "crawl.site"} {
		mux.Handle(typ, handler)
	}
	if err := srv.Start(mux); err != nil {
		t.Fatal(err)
	}
	return &worker{srv: srv}
}

// TestEndToEnd_RunOnceReapsHungHandlerOfRealAsynqWorker runs a real asynq
// worker with the start guard on real Redis and PostgreSQL. One handler
// hangs, one makes progress past its limit, one is within its limit. Time
// passing is simulated by moving the rows' timestamps back on the database
// clock. `run --once` must reap exactly the hung job, and redelivering its
// task must not run the handler: asynq archives it.
func TestEndToEnd_RunOnceReapsHungHandlerOfRealAsynqWorker(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := jobstest.New(t)
	rdb := e2eRedis(t)
	q := "e2e_" + db.Schema
	hung, progressing, fresh := q+"-hung", q+"-progressing", q+"-fresh"
	inspector := asynq.NewInspectorFromRedisClient(rdb)
	t.Cleanup(func() {
		_ = queuetest.Remove(context.Background(), rdb, q)
		rdb.Del(context.Background(), queue.MarkerKey(hung), queue.MarkerKey(progressing), queue.MarkerKey(fresh))
	})

	db.JobType(t, "report.export", "30 minutes", "", "")
	db.JobType(t, "crawl.site", "60 minutes", "", "")
	types := map[string]string{hung: "report.export", progressing: "crawl.site", fresh: "report.export"}
	for id, typ := range types {
		db.Insert(t, jobstest.Job{ID: id, Type: typ, Status: jobs.StatusQueued, Queue: q})
	}

	// W1: every handler blocks, ignoring its context like a hung model call.
	release := make(chan struct{})
	var releaseOnce sync.Once
	t.Cleanup(func() { releaseOnce.Do(func() { close(release) }) })
	started := make(chan string, 3)
	w1 := startWorker(t, db, rdb, q, "w1", func(ctx context.Context, task *asynq.Task) error {
		id, _ := asynq.GetTaskID(ctx)
		started <- id
		<-release
		return errors.New("the hung call finally failed")
	})
	w1Stopped := false
	t.Cleanup(func() {
		if !w1Stopped {
			w1.srv.Shutdown()
		}
	})
	client := asynq.NewClientFromRedisClient(rdb)
	store := db.Store()
	for _, id := range []string{hung, progressing, fresh} {
		if _, err := queue.Enqueue(ctx, client, store, asynq.NewTask(types[id], nil), id); err != nil {
			t.Fatal(err)
		}
	}
	for range 3 {
		select {
		case <-started:
		case <-time.After(20 * time.Second):
			t.Fatal("the worker did not start all three tasks within 20s")
		}
	}

	// 31 minutes after the claim: the hung job last moved 21 minutes ago,
	// the progressing one 2 minutes ago (it is 3 hours into its run).
	db.Exec(t, `UPDATE jobs SET started_at = now() - interval '31 minutes', updated_at = now() - interval '21 minutes' WHERE id = $1`, hung)
	db.Exec(t, `UPDATE jobs SET started_at = now() - interval '3 hours', updated_at = now() - interval '2 minutes' WHERE id = $1`, progressing)
	beforeProgressing, beforeFresh := db.Read(t, progressing), db.Read(t, fresh)

	var stdout, stderr bytes.Buffer
	// --cancel-on-reap=false: this test follows the hung task through a
	// worker shutdown and its redelivery; a cancel would instead schedule
	// asynq's retry after its backoff (TestCase_B30 covers that path).
	code := execute(ctx, []string{"run", "--once", "--output", "json", "--cancel-on-reap=false",
		"--database-url", db.URL, "--schema", db.Schema, "--redis-url", e2eRedisURL, "--queues", q}, &stdout, &stderr)
	t.Logf("stderr:\n%s", stderr.String())
	if code != 0 {
		t.Fatalf("run --once exit code = %d, want 0; stdout %q", code, stdout.String())
	}
	var got struct {
		Scanned, Reaped, Errors int
		Skipped                 map[string]int
		MarkersRestored         int               `json:"markers_restored"`
		ReapedBy                map[string]int    `json:"reaped_by"`
		RetriedBy               map[string]int    `json:"retried_by"`
		RetriesFinished         map[string]int    `json:"retries_finished"`
		StaleQueued             int               `json:"stale_queued"`
		BrokenActive            int               `json:"broken_active"`
		LostLimitTripped        bool              `json:"lost_limit_tripped"`
		Interrupted             bool              `json:"interrupted"`
		Panicked                bool              `json:"panicked"`
		QueuesNotFound          []string          `json:"queues_not_found"`
		ScannedBy               map[string]int    `json:"scanned_by"`
		BadQueueNames           int               `json:"bad_queue_names"`
		MarkersHeld             int               `json:"markers_held"`
		QueueSuggestions        map[string]string `json:"queues_did_you_mean"`
		UncoveredQueues         map[string]int    `json:"uncovered_queues"`
		StallStormHeld          int               `json:"stall_storm_held"`
		StallStormHolds         []json.RawMessage `json:"stall_storm_holds"`
		AtRisk                  int               `json:"at_risk"`
	}
	requireScannedAddsUp(t, stdout.String())
	requireNoScanMismatch(t, stderr.String())
	dec := json.NewDecoder(strings.NewReader(stdout.String()))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&got); err != nil {
		t.Fatalf("stdout is not one JSON object: %v\n%s", err, stdout.String())
	}
	if dec.More() {
		t.Fatalf("stdout holds more than one JSON document:\n%s", stdout.String())
	}
	if got.Scanned != 3 || got.Reaped != 1 || got.Errors != 0 || got.Interrupted || got.Panicked || got.Skipped["progressing"] != 1 || got.Skipped["within_limit"] != 1 || len(got.Skipped) != 2 ||
		got.QueuesNotFound == nil || len(got.QueuesNotFound) != 0 || got.UncoveredQueues == nil || len(got.UncoveredQueues) != 0 ||
		got.StallStormHeld != 0 || got.StallStormHolds == nil || len(got.StallStormHolds) != 0 || got.AtRisk != 0 {
		t.Fatalf("summary = %+v, want scanned 3, reaped 1, skipped progressing 1 and within_limit 1, errors 0, queues_not_found [], uncovered_queues {}, no stall-storm hold, "+
			"none at risk (the progressing job's 2 minutes idle are under half its stall timeout)", got)
	}
	if row := db.Read(t, hung); row.Status != jobs.StatusFailed || row.FailureReason != "stalled" || row.Generation != 1 {
		t.Fatalf("hung job = %+v, want FAILED stalled at generation 1", row)
	}
	if n := db.Events(t, hung, "reaped"); n != 1 {
		t.Fatalf("reaped events = %d, want 1", n)
	}
	ttl, err := rdb.TTL(ctx, queue.MarkerKey(hung)).Result()
	if err != nil || ttl <= 604790*time.Second || ttl > 604800*time.Second {
		t.Fatalf("marker TTL = %v (%v), want in (604790s, 604800s]", ttl, err)
	}
	if row := db.Read(t, progressing); row != beforeProgressing {
		t.Fatalf("progressing job changed: %+v -> %+v", beforeProgressing, row)
	}
	if row := db.Read(t, fresh); row != beforeFresh {
		t.Fatalf("within-limit job changed: %+v -> %+v", beforeFresh, row)
	}

	// W1 shuts down (a rolling deploy): asynq waits ShutdownTimeout, then
	// puts the still-running tasks back in the queue. W2 picks them up.
	w1.srv.Shutdown()
	w1Stopped = true
	var mu sync.Mutex
	calls := map[string]int{}
	w2 := startWorker(t, db, rdb, q, "w2", func(ctx context.Context, task *asynq.Task) error {
		id, _ := asynq.GetTaskID(ctx)
		mu.Lock()
		calls[id]++
		mu.Unlock()
		<-release
		return nil
	})
	t.Cleanup(w2.srv.Shutdown)
	deadline := time.Now().Add(30 * time.Second)
	for {
		info, err := inspector.GetTaskInfo(q, hung)
		if err == nil && info.State == asynq.TaskStateArchived {
			if !strings.Contains(info.LastErr, "reaped") && !strings.Contains(info.LastErr, "FAILED") {
				t.Errorf("archived task's last error = %q, want it to say the job was reaped", info.LastErr)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the redelivered reaped task was not archived within 30s (last state %v, err %v)", stateOf(info), err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	mu.Lock()
	defer mu.Unlock()
	if calls[hung] != 0 {
		t.Fatalf("handler ran %d times for the reaped job after its reap, want 0", calls[hung])
	}
	if row := db.Read(t, hung); row.Status != jobs.StatusFailed || row.Generation != 1 {
		t.Fatalf("hung job after redelivery = %+v, want FAILED at generation 1", row)
	}
}

func stateOf(info *asynq.TaskInfo) string {
	if info == nil {
		return "unknown"
	}
	return fmt.Sprint(info.State)
}

// TestEndToEnd_RunOnceReapsJobWhoseTaskAsynqWillNeverRun covers a worker
// killed on its task's last attempt: the row still says PROCESSING, but
// asynq has archived the task and will never run it again. A stalled job
// whose task waits for its retry is left alone.
func TestEndToEnd_RunOnceReapsJobWhoseTaskAsynqWillNeverRun(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := jobstest.New(t)
	rdb := e2eRedis(t)
	q := "e2e_" + db.Schema
	lost, waiting := q+"-lost", q+"-waiting"
	inspector := asynq.NewInspectorFromRedisClient(rdb)
	t.Cleanup(func() {
		_ = queuetest.Remove(context.Background(), rdb, q)
		rdb.Del(context.Background(), queue.MarkerKey(lost), queue.MarkerKey(waiting))
	})
	db.JobType(t, "report.export", "30 minutes", "", "")
	store := db.Store()
	client := asynq.NewClientFromRedisClient(rdb)
	for _, id := range []string{lost, waiting} {
		db.Insert(t, jobstest.Job{ID: id, Type: "report.export", Status: jobs.StatusQueued, Queue: q})
		// The waiting task is scheduled: it waits while a live worker
		// serves the queue.
		var opts []asynq.Option
		if id == waiting {
			opts = append(opts, asynq.ProcessIn(time.Hour))
		}
		if _, err := queue.Enqueue(ctx, client, store, asynq.NewTask("report.export", nil), id, opts...); err != nil {
			t.Fatal(err)
		}
		// The attempt that was killed had claimed the job 31 minutes ago.
		if _, err := store.Claim(ctx, id, 0, "killed-worker"); err != nil {
			t.Fatal(err)
		}
		db.Exec(t, `UPDATE jobs SET started_at = now() - interval '31 minutes', updated_at = now() - interval '21 minutes' WHERE id = $1`, id)
	}
	if err := inspector.ArchiveTask(q, lost); err != nil {
		t.Fatal(err)
	}
	// A live worker serves the queue: the archived task is truly lost, not
	// a sign of a wrong Redis.
	w := startWorker(t, db, rdb, q, "w-live", func(context.Context, *asynq.Task) error { return nil })
	t.Cleanup(w.srv.Shutdown)

	var stdout, stderr bytes.Buffer
	code := execute(ctx, []string{"run", "--once", "--output", "json",
		"--database-url", db.URL, "--schema", db.Schema, "--redis-url", e2eRedisURL, "--queues", q}, &stdout, &stderr)
	t.Logf("stderr:\n%s", stderr.String())
	var got struct {
		Scanned, Reaped, Errors int
		Skipped                 map[string]int
	}
	if err := json.Unmarshal(stdout.Bytes(), &got); err != nil || code != 0 {
		t.Fatalf("exit %d, stdout %q (%v)", code, stdout.String(), err)
	}
	requireScannedAddsUp(t, stdout.String())
	requireNoScanMismatch(t, stderr.String())
	if got.Scanned != 0 || got.Reaped != 1 || got.Errors != 0 || got.Skipped["awaiting_retry"] != 1 {
		t.Fatalf("summary = %+v, want reaped 1 and awaiting_retry 1", got)
	}
	if row := db.Read(t, lost); row.Status != jobs.StatusFailed || row.FailureReason != "lost_task" {
		t.Fatalf("job of the archived task = %+v, want FAILED lost_task", row)
	}
	if row := db.Read(t, waiting); row.Status != jobs.StatusProcessing {
		t.Fatalf("job whose task waits = %+v, want PROCESSING", row)
	}
	if n, err := rdb.Exists(ctx, queue.MarkerKey(lost)).Result(); err != nil || n != 1 {
		t.Fatalf("marker of the lost job exists = %d (%v), want 1", n, err)
	}
}
