package queue

import (
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
)

// B19: J19 is reaped at 10:31 (FAILED, generation 1, marker set); at 10:35
// asynq delivers T19 again to W2 while W1 still runs the original.
func TestCase_B19_RedeliveredReapedTaskIsRefused(t *testing.T) {
	t.Parallel()

	// reap leaves job id as the reaper does: FAILED at generation 1.
	reap := func(t *testing.T, db *jobstest.DB, id string) {
		t.Helper()
		db.Insert(t, jobstest.Job{ID: id, Type: "report.export", Generation: 1, Worker: "W1",
			StartedAgo: jobstest.Ago(35 * time.Minute), IdleAgo: 25 * time.Minute})
		failRow(t, db, id, jobs.ReasonStalled)
	}

	t.Run("SecondWorkersGuardRunsTheHandlerZeroTimes", func(t *testing.T) {
		t.Parallel()
		b := setupGuard(t)
		reap(t, b.db, "J19")
		if set, err := writeMarker(t.Context(), b.markers, "J19", 1, MarkerTTL); err != nil || !set {
			t.Fatalf("setting reaped:J19: set %v, err %v", set, err)
		}
		b.mr.FastForward(4 * time.Minute) // 10:35
		h := &recorder{}
		err := deliver(t.Context(), b.guard(t, "W2", nil, nil), "J19", h)
		requireRefused(t, err, ErrJobReaped, h)
		r := requireRow(t, b.db, "J19", jobs.StatusFailed, 1)
		if r.Worker != "W1" || r.FailureReason != jobs.ReasonStalled {
			t.Fatalf("J19 row = %+v, want worker W1 and failure_reason stalled untouched", r)
		}
		if n := b.db.Events(t, "J19", "claimed"); n != 0 {
			t.Fatalf("claimed events of J19 = %d, want 0", n)
		}
	})

	t.Run("AsynqArchivesTheRefusedTaskWithoutARetry", func(t *testing.T) {
		t.Parallel()
		db := jobstest.New(t)
		db.JobType(t, "report.export", "30 minutes", "", "")
		// The real Redis is shared: the job ID (= task ID = marker key) is
		// unique to this run, and a short TTL lets the marker expire on its
		// own (nothing deletes a marker).
		id := unique(t, "J19-")
		reap(t, db, id)
		rc := realRedis(t)
		insp := asynq.NewInspectorFromRedisClient(rc)
		queue := unique(t, "b19-")
		deleteQueueAtCleanup(t, rc, queue)
		markers, err := NewMarkerStore(rc)
		if err != nil {
			t.Fatal(err)
		}
		if set, err := writeMarker(t.Context(), markers, id, 1, time.Minute); err != nil || !set {
			t.Fatalf("setting the marker: set %v, err %v", set, err)
		}
		h := &recorder{}
		g := NewGuard(db.Store(), markers, WithWorker("W2"), WithLogger(testLogger(t)))
		mux := asynq.NewServeMux()
		mux.Use(g.Middleware())
		mux.Handle("report.export", h)
		startServer(t, rc, queue, asynq.Config{IsFailure: IsFailure}, mux)

		client := asynq.NewClientFromRedisClient(rc)
		if _, err := client.EnqueueContext(t.Context(), asynq.NewTask("report.export", nil),
			asynq.TaskID(id), asynq.Queue(queue), asynq.MaxRetry(25)); err != nil {
			t.Fatal(err)
		}
		var info *asynq.TaskInfo
		jobstest.Eventually(t, "T19 is archived", func() bool {
			info, err = insp.GetTaskInfo(queue, id)
			return err == nil && info.State == asynq.TaskStateArchived
		})
		if info.Retried != 0 || !strings.Contains(info.LastErr, "job was reaped") {
			t.Fatalf("archived T19: retried %d, last error %q; want 0 retries and a refusal naming the reap", info.Retried, info.LastErr)
		}
		if h.runs() != 0 {
			t.Fatalf("handler ran %d times, want 0", h.runs())
		}
	})
}

// B22: J22 is reaped at 10:31 and reaped:J22 set with TTL 604800; at 10:33
// W1's late completion deletes the task's Redis keys; T22 is delivered again
// at 11:00.
func TestCase_B22_MarkerSurvivesCleanupAndExpiresOnly(t *testing.T) {
	t.Parallel()
	b := setupGuard(t)
	b.db.Insert(t, jobstest.Job{ID: "J22", Type: "report.export", Generation: 1, Worker: "W1",
		StartedAgo: jobstest.Ago(35 * time.Minute), IdleAgo: 25 * time.Minute})
	failRow(t, b.db, "J22", jobs.ReasonStalled)

	rc := b.rc
	client := asynq.NewClientFromRedisClient(rc)
	if _, err := client.EnqueueContext(t.Context(), asynq.NewTask("report.export", []byte(`{"report":22}`)),
		asynq.TaskID("J22"), asynq.Unique(time.Hour)); err != nil {
		t.Fatalf("enqueueing T22: %v", err)
	}

	ttl := func(when string) float64 {
		t.Helper()
		d, err := rc.TTL(t.Context(), "jobreaper:reaped:J22").Result()
		if err != nil {
			t.Fatal(err)
		}
		if d <= 0 { // -1: no expiry, -2: gone
			t.Fatalf("TTL reaped:J22 at %s = %v, want a positive TTL (never -1)", when, d)
		}
		return d.Seconds()
	}

	// 10:31, the reap.
	if set, err := writeMarker(t.Context(), b.markers, "J22", 1, MarkerTTL); err != nil || !set {
		t.Fatalf("setting reaped:J22: set %v, err %v", set, err)
	}
	if got := ttl("10:31"); got != 604800 {
		t.Fatalf("TTL reaped:J22 at 10:31 = %v, want 604800", got)
	}

	// 10:33, W1's cleanup deletes every key under the task's prefix: the
	// task hash and its unique lock.
	b.mr.FastForward(2 * time.Minute)
	var deleted []string
	for _, pattern := range []string{"asynq:{default}:t:J22*", "asynq:{default}:unique:*"} {
		keys, err := rc.Keys(t.Context(), pattern).Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range keys {
			if err := rc.Del(t.Context(), k).Err(); err != nil {
				t.Fatal(err)
			}
			deleted = append(deleted, k)
		}
	}
	if len(deleted) != 2 {
		t.Fatalf("cleanup deleted %v, want the task hash and the unique lock of T22", deleted)
	}
	ttl("10:33")

	// 11:00, T22 is delivered again.
	b.mr.FastForward(27 * time.Minute)
	if got := ttl("11:00"); got < 603000 || got > 603060 {
		t.Fatalf("TTL reaped:J22 at 11:00 = %v, want between 603000 and 603060", got)
	}
	h := &recorder{}
	g := b.guard(t, "W2", nil, nil)
	requireRefused(t, deliver(t.Context(), g, "J22", h), ErrJobReaped, h)

	// The marker refuses on its own: even a read of the row that still
	// showed PROCESSING at generation 1 would not start T22.
	b.db.Exec(t, `UPDATE jobs SET status = 'PROCESSING', failure_reason = NULL, finished_at = NULL WHERE id = 'J22'`)
	err := deliver(t.Context(), g, "J22", h)
	requireRefused(t, err, ErrJobReaped, h)
	if !strings.Contains(err.Error(), "marker jobreaper:reaped:J22") {
		t.Fatalf("refusal %q was not the marker's", err)
	}

	// Only expiry removes it: gone 7 days after the reap, not before.
	b.mr.FastForward(MarkerTTL - 29*time.Minute - time.Second)
	if _, found, _ := b.markers.Get(t.Context(), "J22"); !found {
		t.Fatal("reaped:J22 is gone before 7 days after the reap")
	}
	b.mr.FastForward(2 * time.Second)
	if _, found, _ := b.markers.Get(t.Context(), "J22"); found {
		t.Fatal("reaped:J22 outlived 7 days after the reap")
	}
}

// An outage of the guard's PostgreSQL delays the task in asynq's retry set
// without using up a retry, as IsFailure documents.
func TestGuardOutageDoesNotUseUpRetries(t *testing.T) {
	t.Parallel()
	rc := realRedis(t)
	insp := asynq.NewInspectorFromRedisClient(rc)
	queue := unique(t, "outage-")
	deleteQueueAtCleanup(t, rc, queue)
	_, mc := miniRedis(t)
	markers, err := NewMarkerStore(mc)
	if err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.New(t.Context(), "postgres://jobreaper@127.0.0.1:1/test?connect_timeout=2")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	h := &recorder{}
	g := NewGuard(jobs.NewStore(pool), markers, WithWorker("W2"), WithLogger(testLogger(t)))
	startServer(t, rc, queue, asynq.Config{
		IsFailure:      IsFailure,
		RetryDelayFunc: func(int, error, *asynq.Task) time.Duration { return time.Hour },
	}, g.Middleware()(h))

	client := asynq.NewClientFromRedisClient(rc)
	if _, err := client.EnqueueContext(t.Context(), asynq.NewTask("report.export", nil),
		asynq.TaskID("J1"), asynq.Queue(queue), asynq.MaxRetry(3)); err != nil {
		t.Fatal(err)
	}
	var info *asynq.TaskInfo
	jobstest.Eventually(t, "the task waits in the retry set", func() bool {
		info, err = insp.GetTaskInfo(queue, "J1")
		return err == nil && info.State == asynq.TaskStateRetry
	})
	if info.Retried != 0 || !strings.Contains(info.LastErr, ErrGuardUnavailable.Error()) {
		t.Fatalf("task in retry: retried %d, last error %q; want 0 retries used and the guard's unavailable error", info.Retried, info.LastErr)
	}
	if h.runs() != 0 {
		t.Fatalf("handler ran %d times, want 0", h.runs())
	}
}
