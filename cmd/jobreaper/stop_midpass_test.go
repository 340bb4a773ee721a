package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
	"github.com/jobreaper/jobreaper/queue"
)

// What deploy/jobreaper.service says of SIGTERM: the daemon stops at once,
// mid-pass, and cleanly. Its pass's reap waits on a job row another
// transaction holds; the stop cancels the pass, the daemon exits 0 well
// before the lock is released, and the reap in flight rolled back: the job
// is still PROCESSING, with no reaped event and no marker.
func TestDaemonStopsMidPassAndItsReapInFlightRollsBack(t *testing.T) {
	t.Parallel()
	db := jobstest.New(t)
	rdb := realRedis(t)
	q, id := unique("midpass"), unique("Jmid")
	db.JobType(t, "report.export", "30 minutes", "", "")
	db.Insert(t, jobstest.Job{ID: id, Type: "report.export", Generation: 1, Queue: q, Worker: "w1",
		StartedAgo: jobstest.Ago(31 * time.Minute), IdleAgo: 21 * time.Minute})
	activeTask(t, id, q)
	t.Cleanup(func() { rdb.Del(context.WithoutCancel(t.Context()), queue.MarkerKey(id)) })

	// The row lock the reap will wait for.
	tx, err := db.Pool.Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(t.Context())) }()
	if _, err := tx.Exec(t.Context(), `SELECT 1 FROM `+db.Table("jobs")+` WHERE id = $1 FOR UPDATE`, id); err != nil {
		t.Fatal(err)
	}

	ctx, stop := context.WithCancel(t.Context())
	defer stop()
	var stdout bytes.Buffer
	var stderr jobstest.SyncBuffer
	done := make(chan int, 1)
	go func() {
		done <- execute(ctx, []string{"run", "--database-url", db.URL, "--schema", db.Schema, "--redis-url", redisTestURL(),
			"--queues", q, "--interval", "1m", "--start-jitter", "0s", "--metrics-addr", "127.0.0.1:0"}, &stdout, &stderr)
	}()
	defer func() {
		if t.Failed() {
			t.Logf("daemon stderr:\n%s", stderr.String())
		}
	}()
	jobstest.Eventually(t, "the daemon's reap waits for the row lock", func() bool {
		return db.Count(t, `SELECT count(*) FROM pg_stat_activity
 WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%' || $1 || '%'`, db.Schema) > 0
	})

	stop() // what SIGTERM does through signal.NotifyContext
	select {
	case code := <-done:
		if code != exitOK || !strings.Contains(stderr.String(), "jobreaper stopped") {
			t.Fatalf("exit code %d (want 0); stderr:\n%s", code, stderr.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("the daemon did not stop within 30s of its signal while its reap waited for a lock; stderr:\n%s", stderr.String())
	}
	if err := tx.Rollback(t.Context()); err != nil {
		t.Fatal(err)
	}
	if row := db.Read(t, id); row.Status != jobs.StatusProcessing || row.Generation != 1 {
		t.Fatalf("row = %+v, want PROCESSING at generation 1: the reap in flight must roll back", row)
	}
	if n := db.Events(t, id, "reaped"); n != 0 {
		t.Fatalf("%d reaped events, want 0", n)
	}
	if n, err := rdb.Exists(t.Context(), queue.MarkerKey(id)).Result(); err != nil || n != 0 {
		t.Fatalf("marker exists = %d (%v), want none", n, err)
	}
}
