package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/jobreaper/jobreaper/internal/fleettest"
	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
	"github.com/jobreaper/jobreaper/queue"
	"github.com/jobreaper/jobreaper/queue/queuetest"
)

// A daemon that dies between the delete of a retry-reaped lost job's
// archived task and the enqueue of its replacement (failpoint
// retry-replace-after-delete: the pass panics there, as a crash would stop
// it) leaves a QUEUED row without a task; the next pass fails it, with
// reap_retry_impossible in its event, its cascade and its marker.
func TestRetryReapCrashBetweenDeleteAndEnqueueIsFailedNextPass(t *testing.T) {
	t.Parallel()
	bin := fleettest.BuildJobreaper(t)
	db := jobstest.New(t)
	rdb := e2eRedis(t)
	q, id := unique("retrycrash"), unique("Jcrash")
	t.Cleanup(func() {
		_ = queuetest.Remove(context.Background(), rdb, q)
		rdb.Del(context.Background(), queue.MarkerKey(id))
	})
	db.JobType(t, "report.export", "30 minutes", "", "")
	db.Exec(t, `UPDATE job_types SET reap_retries = 1 WHERE name = 'report.export'`)
	db.Insert(t, jobstest.Job{ID: id, Type: "report.export", Generation: 1, Queue: q, Worker: "w-dead",
		StartedAgo: jobstest.Ago(2 * time.Hour), IdleAgo: time.Hour})
	if _, err := asynq.NewClientFromRedisClient(rdb).EnqueueContext(t.Context(), asynq.NewTask("report.export", []byte("p")),
		asynq.TaskID(id), asynq.Queue(q), asynq.ProcessIn(time.Hour)); err != nil {
		t.Fatal(err)
	}
	insp := asynq.NewInspectorFromRedisClient(rdb)
	if err := insp.ArchiveTask(q, id); err != nil {
		t.Fatal(err)
	}
	// A live server serves the queue (its handler never gets a task).
	srv := asynq.NewServerFromRedisClient(rdb, asynq.Config{Queues: map[string]int{q: 1}, LogLevel: asynq.FatalLevel})
	if err := srv.Start(asynq.HandlerFunc(func(context.Context, *asynq.Task) error { return nil })); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	jobstest.Eventually(t, "asynq lists the live server", func() bool {
		servers, err := insp.Servers()
		return err == nil && len(servers) > 0
	})

	args := []string{"run", "--once", "--output", "json", "--database-url", db.URL, "--schema", db.Schema,
		"--redis-url", e2eRedisURL, "--queues", q}
	first := fleettest.Run(t, bin, "retry-replace-after-delete=panic", nil, args...)
	if !strings.Contains(first.Stderr, "failpoint retry-replace-after-delete reached") {
		t.Fatalf("the failpoint was not reached: exit %d\n%s\n%s", first.Code, first.Stdout, first.Stderr)
	}
	if row := db.Read(t, id); row.Status != jobs.StatusQueued || row.Generation != 2 {
		t.Fatalf("row after the crash = %+v, want QUEUED at generation 2 (the retry reap committed)", row)
	}
	if _, err := insp.GetTaskInfo(q, id); err == nil {
		t.Fatal("the archived task is still there: the failpoint was not between the delete and the enqueue")
	}
	// A pass an interval later.
	db.Exec(t, `UPDATE job_events SET at = at - interval '2 minutes' WHERE job_id = $1`, id)
	second := fleettest.Run(t, bin, "", nil, args...)
	if second.Code != exitOK {
		t.Fatalf("second pass: exit %d\n%s\n%s", second.Code, second.Stdout, second.Stderr)
	}
	var sum struct {
		RetriesFinished map[string]int `json:"retries_finished"`
	}
	if err := json.Unmarshal([]byte(second.Stdout), &sum); err != nil || sum.RetriesFinished["failed_impossible"] != 1 {
		t.Fatalf("second pass summary %s (%v), want retries_finished.failed_impossible 1", second.Stdout, err)
	}
	if row := db.Read(t, id); row.Status != jobs.StatusFailed || row.FailureReason != jobs.ReasonLostTask || row.Generation != 2 {
		t.Fatalf("row = %+v, want FAILED lost_task at generation 2", row)
	}
	if n := db.Count(t, `SELECT count(*) FROM job_events WHERE job_id = $1 AND kind = 'reaped' AND generation = 2
   AND detail->>'reap_retry_impossible' = 'true'`, id); n != 1 {
		t.Fatalf("%d reaped events with reap_retry_impossible, want 1", n)
	}
	if g, err := rdb.Get(t.Context(), queue.MarkerKey(id)).Result(); err != nil || g == "" {
		t.Fatalf("marker %q, %v; want one written", g, err)
	}
}
