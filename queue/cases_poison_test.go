package queue

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

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

// A marker key someone else wrote (B38's "yes", or a hash) is one bad item:
// the guard's marker reader names the key and wraps ErrBadMarker, on the
// real Redis (the reaper's writer refuses it too: internal/asynqstate).
func TestMarkerKeyOfAnotherToolIsABadMarker(t *testing.T) {
	t.Parallel()
	rc := realRedis(t)
	s, err := NewMarkerStore(rc)
	if err != nil {
		t.Fatal(err)
	}
	str, hash := unique(t, "X-str-"), unique(t, "X-hash-")
	t.Cleanup(func() { rc.Del(context.Background(), MarkerKey(str), MarkerKey(hash)) })
	if err := rc.Set(t.Context(), MarkerKey(str), "yes", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	if err := rc.HSet(t.Context(), MarkerKey(hash), "reaped", "1").Err(); err != nil {
		t.Fatal(err)
	}
	rc.Expire(t.Context(), MarkerKey(hash), time.Minute)
	for _, id := range []string{str, hash} {
		_, _, err := s.Get(t.Context(), id)
		if !errors.Is(err, ErrBadMarker) || !strings.Contains(err.Error(), MarkerKey(id)) {
			t.Fatalf("Get of %s: err = %v, want ErrBadMarker naming the key", MarkerKey(id), err)
		}
	}
}

// The guard does not retry a task forever, uncounted, because its marker
// key holds garbage: it is a counted failure naming the key (asynq retries
// it with backoff and archives it in the end), and the handler never runs.
func TestGuardCountsAGarbageMarkerAsAFailure(t *testing.T) {
	t.Parallel()
	b := setupGuard(t)
	b.db.Insert(t, jobstest.Job{ID: "X", Type: "report.export", Status: jobs.StatusQueued})
	if err := b.mr.Set(MarkerKey("X"), "yes"); err != nil {
		t.Fatal(err)
	}
	h := &recorder{}
	err := deliver(t.Context(), b.guard(t, "W1", nil, nil), "X", h)
	if !errors.Is(err, ErrBadMarker) || errors.Is(err, asynq.SkipRetry) || errors.Is(err, ErrGuardUnavailable) || !IsFailure(err) {
		t.Fatalf("guard returned %v, want a counted, retryable failure wrapping ErrBadMarker", err)
	}
	if !strings.Contains(err.Error(), "jobreaper:reaped:X") {
		t.Fatalf("error %q does not name the key", err)
	}
	if n := h.runs(); n != 0 {
		t.Fatalf("handler ran %d times, want 0", n)
	}
	if got := b.decisions("bad_marker"); got != 1 {
		t.Fatalf("bad_marker decisions = %v, want 1", got)
	}
	requireRow(t, b.db, "X", jobs.StatusQueued, 0)
	if n := b.db.Events(t, "X", "claimed"); n != 0 {
		t.Fatalf("claimed events = %d, want 0", n)
	}
}
