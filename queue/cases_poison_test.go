package queue

import (
	"strings"
	"testing"

	"github.com/hibiken/asynq"

	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
)

// B33 (the guard's part): another producer sharing the Redis enqueues a
// task whose ID holds a NUL byte; asynq accepts it, PostgreSQL text does
// not. The guard refuses it as a permanent failure: asynq archives it
// without a retry, the handler never runs and nothing is written.
func TestCase_B33_GuardRefusesAnOddTaskIDForGood(t *testing.T) {
	t.Parallel()

	t.Run("AsynqArchivesTheTaskWithoutARetry", func(t *testing.T) {
		t.Parallel()
		b := setupGuard(t)
		rc := realRedis(t)
		insp := asynq.NewInspectorFromRedisClient(rc)
		queue := unique(t, "b33-")
		deleteQueueAtCleanup(t, rc, queue)
		h := &recorder{}
		g := NewGuard(b.store, b.markers, WithWorker("W1"), WithLogger(testLogger(t)), WithRegisterer(b.reg))
		mux := asynq.NewServeMux()
		mux.Use(g.Middleware())
		mux.Handle("report.export", h)
		startServer(t, rc, queue, asynq.Config{IsFailure: IsFailure}, mux)

		id := "odd\x00" + unique(t, "J33-")
		client := asynq.NewClientFromRedisClient(rc)
		if _, err := client.EnqueueContext(t.Context(), asynq.NewTask("report.export", nil),
			asynq.TaskID(id), asynq.Queue(queue), asynq.MaxRetry(25)); err != nil {
			t.Fatalf("asynq refused the odd ID: %v", err)
		}
		var info *asynq.TaskInfo
		jobstest.Eventually(t, "the odd task is archived", func() bool {
			var err error
			info, err = insp.GetTaskInfo(queue, id)
			return err == nil && info.State == asynq.TaskStateArchived
		})
		if info.Retried != 0 || !strings.Contains(info.LastErr, `contains a NUL byte`) {
			t.Fatalf("archived task: retried %d, last error %q; want 0 retries and a refusal naming the NUL byte", info.Retried, info.LastErr)
		}
		if n := h.runs(); n != 0 {
			t.Fatalf("handler ran %d times, want 0", n)
		}
		if got := b.decisions("bad_job_id"); got != 1 {
			t.Fatalf("bad_job_id decisions = %v, want 1", got)
		}
		for _, table := range []string{"jobs", "job_events", "job_batches"} {
			if n := b.db.Count(t, `SELECT count(*) FROM `+table); n != 0 {
				t.Fatalf("%s holds %d rows, want 0: nothing may be written", table, n)
			}
		}
	})

	// The same holds for every ID CheckID refuses, and nothing is read
	// either: the store is nil, so any read would panic.
	for name, id := range map[string]string{
		"InvalidUTF8":        "J33-\xff\xfe",
		"OverTheLimit":       strings.Repeat("j", jobs.MaxIDLength+1),
		"NulByteInTheMiddle": "J33\x00b",
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setupGuard(t)
			g := NewGuard(nil, nil, WithLogger(testLogger(t)), WithRegisterer(b.reg))
			g.taskID = testTaskID
			h := &recorder{}
			err := deliver(t.Context(), g, id, h)
			requireRefused(t, err, jobs.ErrBadID, h)
			if !IsFailure(err) {
				t.Fatalf("IsFailure(%v) = false, want a counted failure", err)
			}
			if got := b.decisions("bad_job_id"); got != 1 {
				t.Fatalf("bad_job_id decisions = %v, want 1", got)
			}
		})
	}
}
