package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/jobreaper/jobreaper/internal/fleettest"
	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
	"github.com/jobreaper/jobreaper/queue"
	"github.com/jobreaper/jobreaper/queue/redistest"
)

// A worker process is killed with SIGKILL on its tasks' last attempt;
// asynq archives the tasks (the recoverer of another live worker process of
// that queue finds their expired leases). The first pass after the stall
// rule holds reaps J-a as lost_task, exactly once, with its cascade. J-b,
// with no live worker for the queue, is held until one starts, then reaped.
func TestKilledWorker_LostTaskIsReapedOnceWithItsCascade(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := jobstest.New(t)
	db.JobType(t, "report.export", "30 minutes", "", "")
	db.Exec(t, `CREATE TABLE failures (job_id text PRIMARY KEY)`)
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	q := "killed"
	ja, jb := "J-a", "J-b"
	for _, id := range []string{ja, jb} {
		db.Insert(t, jobstest.Job{ID: id, Type: "report.export", Status: jobs.StatusQueued, Queue: q})
	}
	// A worker process whose handlers hang until the process dies.
	child := fleettest.StartWorker(t, fleettest.BuildWorker(t), fleettest.WorkerOptions{Name: "w-killed",
		DatabaseURL: db.URL, Schema: db.Schema, RedisURL: srv.URL, Queue: q, Args: []string{"--kind", "hang"}})
	store := db.Store()
	client := asynq.NewClientFromRedisClient(rdb)
	jobstest.Eventually(t, "the worker process serves the queue", func() bool {
		servers, err := asynq.NewInspectorFromRedisClient(rdb).Servers()
		return err == nil && len(servers) == 1
	})
	for _, id := range []string{ja, jb} {
		if _, err := queue.Enqueue(ctx, client, store, asynq.NewTask("report.export", nil), id, asynq.MaxRetry(0)); err != nil {
			t.Fatal(err)
		}
	}
	jobstest.Eventually(t, "the worker process claimed both jobs", func() bool {
		return db.Read(t, ja).Worker == "w-killed" && db.Read(t, jb).Worker == "w-killed"
	})
	// The other worker process of the queue, live from now on (it finds no
	// pending task to take): its recoverer archives the tasks whose lease
	// expired.
	live := asynq.NewServerFromRedisClient(rdb, asynq.Config{Queues: map[string]int{q: 1}, LogLevel: asynq.FatalLevel})
	if err := live.Start(asynq.HandlerFunc(func(context.Context, *asynq.Task) error { return nil })); err != nil {
		t.Fatal(err)
	}
	liveStopped := false
	t.Cleanup(func() {
		if !liveStopped {
			live.Shutdown()
		}
	})
	child.Signal(t, syscall.SIGKILL)
	child.Wait(t)
	insp := asynq.NewInspectorFromRedisClient(rdb)
	deadline := time.Now().Add(3 * time.Minute) // asynq: a 30 s lease, a recoverer every minute
	for {
		a, errA := insp.GetTaskInfo(q, ja)
		b, errB := insp.GetTaskInfo(q, jb)
		if errA == nil && errB == nil && a.State == asynq.TaskStateArchived && b.State == asynq.TaskStateArchived {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("asynq did not archive the tasks of the killed worker within 3 min")
		}
		time.Sleep(time.Second) // polling asynq's recoverer
	}

	config := filepath.Join(t.TempDir(), "jobreaper.yaml")
	if err := os.WriteFile(config, []byte("cascades:\n  report.export:\n    on_failed:\n      - 'INSERT INTO failures (job_id) VALUES (@job_id)'\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	pass := func() map[string]json.RawMessage {
		t.Helper()
		r := run(t, "run", "--once", "--output", "json", "--config", config, "--database-url", db.URL, "--schema", db.Schema,
			"--redis-url", srv.URL, "--queues", q)
		requireExit(t, r, exitOK)
		var doc map[string]json.RawMessage
		if err := json.Unmarshal([]byte(r.stdout), &doc); err != nil {
			t.Fatal(err)
		}
		requireScannedAddsUp(t, r.stdout)
		return doc
	}
	// Before the stall rule holds nothing is reaped.
	if doc := pass(); string(doc["reaped"]) != "0" {
		t.Fatalf("pass before the stall rule holds reaped %s", doc["reaped"])
	}
	db.Exec(t, `UPDATE jobs SET started_at = now() - interval '31 minutes', updated_at = now() - interval '21 minutes' WHERE id = $1`, ja)
	doc := pass()
	if string(doc["reaped_by"]) != `{"lost_task":1,"stalled":0}` {
		t.Fatalf("first pass after the stall rule holds: %v; want J-a reaped as lost_task", string(doc["reaped_by"]))
	}
	if doc := pass(); string(doc["reaped"]) != "0" {
		t.Fatalf("a second pass reaped %s more", doc["reaped"])
	}
	if row := db.Read(t, ja); row.Status != jobs.StatusFailed || row.FailureReason != jobs.ReasonLostTask {
		t.Fatalf("J-a = %+v", row)
	}
	if db.Events(t, ja, "reaped") != 1 || db.Count(t, `SELECT count(*) FROM failures WHERE job_id = $1`, ja) != 1 {
		t.Fatalf("J-a: %d reaped events, %d cascade rows; want 1 and 1", db.Events(t, ja, "reaped"),
			db.Count(t, `SELECT count(*) FROM failures WHERE job_id = $1`, ja))
	}

	// No live worker for the queue: J-b is held.
	live.Shutdown()
	liveStopped = true
	db.Exec(t, `UPDATE jobs SET started_at = now() - interval '31 minutes', updated_at = now() - interval '21 minutes' WHERE id = $1`, jb)
	r := run(t, "run", "--once", "--output", "json", "--config", config, "--database-url", db.URL, "--schema", db.Schema,
		"--redis-url", srv.URL, "--queues", q)
	requireExit(t, r, exitOK)
	if !strings.Contains(r.stdout, `"lost_held":1`) || !strings.Contains(r.stdout, `"reaped":0`) {
		t.Fatalf("pass without a live worker: %s; want J-b held", r.stdout)
	}
	if row := db.Read(t, jb); row.Status != jobs.StatusProcessing {
		t.Fatalf("J-b = %+v, want PROCESSING while held", row)
	}
	// A worker starts: J-b is reaped.
	again := asynq.NewServerFromRedisClient(rdb, asynq.Config{Queues: map[string]int{q: 1}, LogLevel: asynq.FatalLevel})
	if err := again.Start(asynq.HandlerFunc(func(context.Context, *asynq.Task) error { return nil })); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(again.Shutdown)
	if doc := pass(); string(doc["reaped_by"]) != `{"lost_task":1,"stalled":0}` {
		t.Fatalf("pass once a worker serves the queue: %s; want J-b reaped as lost_task", string(doc["reaped_by"]))
	}
	if db.Events(t, jb, "reaped") != 1 || db.Count(t, `SELECT count(*) FROM failures WHERE job_id = $1`, jb) != 1 {
		t.Fatal("J-b was not reaped once with its cascade")
	}
}
