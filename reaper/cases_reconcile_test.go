package reaper_test

import (
	"context"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/jobreaper/jobreaper/internal/asynqstate"
	"github.com/jobreaper/jobreaper/internal/pgcore"
	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
	"github.com/jobreaper/jobreaper/queue"
	"github.com/jobreaper/jobreaper/queue/redistest"
	"github.com/jobreaper/jobreaper/reaper"
)

// ownRedis is a redis-server of the test's own (it loses keys, changes its
// policy) with the test's database, a marker store and a pass factory.
type ownRedis struct {
	srv     *redistest.Server
	rc      *redis.Client
	db      *jobstest.DB
	markers *markerStore
	reg     *prometheus.Registry
	metrics *reaper.Metrics
	logs    *evictionLogs
}

func newOwnRedis(t *testing.T, args ...string) *ownRedis {
	t.Helper()
	srv := redistest.Start(t, args...)
	o := &ownRedis{srv: srv, rc: srv.Client(t), db: jobstest.New(t), reg: prometheus.NewRegistry(), logs: &evictionLogs{}}
	o.markers = newMarkers(t, o.rc)
	o.metrics = reaper.NewMetrics(o.reg)
	o.db.JobType(t, "report.export", "30 minutes", "", "")
	return o
}

// reaper returns a Reaper over o's database and Redis with lister.
func (o *ownRedis) reaper(t *testing.T, lister reaper.Lister, set func(*reaper.Options)) *reaper.Reaper {
	t.Helper()
	opts := reaper.Options{Queues: []string{"q"}, Rule: baselineRule, Metrics: o.metrics,
		Eviction: asynqstate.NewPolicyReader(o.rc, 0),
		Logger:   slog.New(slog.NewTextHandler(io.MultiWriter(tWriter{t}, o.logs), &slog.HandlerOptions{Level: slog.LevelDebug}))}
	if set != nil {
		set(&opts)
	}
	return reaper.New(o.db.Daemon(), lister, o.markers, opts)
}

// reapOne reaps job id (stalled, listed active in queue "q") by a real
// pass, so that its marker is written and confirmed, then moves the reap
// ago into the past on the database clock.
func (o *ownRedis) reapOne(t *testing.T, id string, ago time.Duration) {
	t.Helper()
	o.db.Insert(t, jobstest.Job{ID: id, Type: "report.export", Generation: 1, Queue: "q",
		StartedAgo: jobstest.Ago(31 * time.Minute), IdleAgo: 21 * time.Minute})
	lister := &fakeLister{queues: map[string]asynqstate.ActiveTasks{"q": {IDs: []string{id}}}}
	res, err := runOnce(t, t.Context(), o.reaper(t, lister, nil))
	if err != nil || res.Reaped != 1 {
		t.Fatalf("reaping %s: %+v, %v", id, res, err)
	}
	if o.db.Count(t, `SELECT count(*) FROM jobs WHERE id = $1 AND marker_set_at IS NOT NULL`, id) != 1 {
		t.Fatalf("%s's marker write was not confirmed", id)
	}
	o.db.Exec(t, `UPDATE jobs SET finished_at = finished_at - $2::interval, marker_set_at = marker_set_at - $2::interval WHERE id = $1`,
		id, pgcore.Interval(ago))
}

// ttl returns the marker's TTL in seconds (-2: no key).
func (o *ownRedis) ttl(t *testing.T, id string) float64 {
	t.Helper()
	d, err := o.rc.TTL(t.Context(), queue.MarkerKey(id)).Result()
	if err != nil {
		t.Fatal(err)
	}
	return d.Seconds()
}

// requireGuardRefuses runs a real asynq worker with the start guard on o's
// Redis, delivers job id's task and requires the guard to refuse it: the
// handler never runs and asynq archives the task.
func (o *ownRedis) requireGuardRefuses(t *testing.T, id string) {
	t.Helper()
	var ran atomic.Int32
	guard := queue.NewGuard(o.db.Store(), o.markers, queue.WithWorker("w-redelivery"))
	srv := asynq.NewServerFromRedisClient(o.rc, asynq.Config{Queues: map[string]int{"q": 1}, Concurrency: 2,
		LogLevel: asynq.FatalLevel, IsFailure: queue.IsFailure})
	mux := asynq.NewServeMux()
	mux.Use(guard.Middleware())
	mux.HandleFunc("report.export", func(context.Context, *asynq.Task) error { ran.Add(1); return nil })
	if err := srv.Start(mux); err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	if _, err := asynq.NewClientFromRedisClient(o.rc).EnqueueContext(t.Context(), asynq.NewTask("report.export", nil),
		asynq.TaskID(id), asynq.Queue("q")); err != nil {
		t.Fatal(err)
	}
	insp := asynq.NewInspectorFromRedisClient(o.rc)
	jobstest.Eventually(t, "the redelivered task is archived", func() bool {
		info, err := insp.GetTaskInfo("q", id)
		return err == nil && info.State == asynq.TaskStateArchived
	})
	if ran.Load() != 0 {
		t.Fatalf("the handler of reaped job %s ran %d times, want 0", id, ran.Load())
	}
}

// B21: a failover loses a marker that was written and confirmed. The guard
// still refuses the task from the FAILED row; a pass restores the marker
// with what is left of its 7 days (604800 s minus the seconds since the
// reap, within 60 s); a later pass never extends it; a marker holding a
// newer generation is never overwritten.
func TestCase_B21_FailoverLosesAConfirmedMarker(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	o := newOwnRedis(t)
	j21, newer := "J21", "J21-newer"
	o.reapOne(t, j21, 2*time.Hour)
	o.reapOne(t, newer, time.Hour)
	// The promoted replica has neither key; J21-newer was since requeued
	// and reaped again elsewhere, at generation 5, with its own marker.
	if err := o.rc.Del(ctx, queue.MarkerKey(j21), queue.MarkerKey(newer)).Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := o.markers.Set(ctx, newer, 5, time.Hour); err != nil {
		t.Fatal(err)
	}
	o.requireGuardRefuses(t, j21)

	idle := &fakeLister{queues: map[string]asynqstate.ActiveTasks{"q": {}}}
	res, err := runOnce(t, ctx, o.reaper(t, idle, func(opts *reaper.Options) { opts.Once = true }))
	if err != nil || res.MarkersRestored != 1 || res.Errors != 0 {
		t.Fatalf("pass = %+v, %v; want exactly J21's marker restored", res, err)
	}
	want := float64(queue.MarkerTTL/time.Second) - (2 * time.Hour).Seconds()
	if got := o.ttl(t, j21); got < want-60 || got > want+1 {
		t.Fatalf("TTL of J21's restored marker = %v s, want %v s (604800 minus the 2 h since the reap) within 60 s", got, want)
	}
	if g, _ := o.rc.Get(ctx, queue.MarkerKey(newer)).Result(); g != "5" || o.ttl(t, newer) > 3600 {
		t.Fatalf("the newer generation's marker = %q, TTL %v; want 5 kept with its own TTL", g, o.ttl(t, newer))
	}
	if got := metricValue(t, o.reg, "jobreaper_markers_repaired_total", map[string]string{"cause": "lost"}); got != 1 {
		t.Fatalf("jobreaper_markers_repaired_total{cause=lost} = %v, want 1", got)
	}
	// A later pass finds it there and never extends it.
	first := o.ttl(t, j21)
	res, err = runOnce(t, ctx, o.reaper(t, idle, func(opts *reaper.Options) { opts.Once = true }))
	if err != nil || res.MarkersRestored != 0 {
		t.Fatalf("second pass = %+v, %v; want nothing restored", res, err)
	}
	if got := o.ttl(t, j21); got > first {
		t.Fatalf("TTL went from %v to %v: a later pass extended it", first, got)
	}
}

// B21, the window: the daemon re-asserts every marker of the last 7 days
// within marker_check_window (1 h, passes every minute), whatever their
// number; here 300 lost markers are all back within 60 passes, and every
// pass does a slice, not all of them.
func TestCase_B21_EveryMarkerIsReassertedWithinTheWindow(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	o := newOwnRedis(t)
	const n = 300
	o.db.Exec(t, `INSERT INTO jobs (id, type, status, generation, queue, failure_reason, finished_at, marker_set_at)
SELECT 'W' || lpad(i::text, 4, '0'), 'report.export', 'FAILED', 1, 'q', 'stalled',
       now() - (i * interval '30 minutes'), now() - (i * interval '30 minutes')
  FROM generate_series(1, $1::int) AS i`, n)
	idle := &fakeLister{queues: map[string]asynqstate.ActiveTasks{"q": {}}}
	r := o.reaper(t, idle, func(opts *reaper.Options) {
		opts.Interval, opts.MarkerCheckWindow = time.Minute, time.Hour
	})
	restored := 0
	for pass := 1; restored < n; pass++ {
		if pass > 60 {
			t.Fatalf("after 60 passes (the 1 h window) %d of %d markers are restored", restored, n)
		}
		res, err := runOnce(t, ctx, r)
		if err != nil || res.Errors != 0 {
			t.Fatalf("pass %d = %+v, %v", pass, res, err)
		}
		if res.MarkersRestored == 0 || res.MarkersRestored > n/30 {
			t.Fatalf("pass %d restored %d markers, want a slice of about %d", pass, res.MarkersRestored, n/60)
		}
		restored += res.MarkersRestored
	}
	// Markers of jobs reaped more than 7 days ago are not written: i = 300
	// is 150 h ago, within; each has what is left of its 7 days.
	if got := o.ttl(t, "W0300"); got < 604800-150*3600-60 || got > 604800-150*3600+1 {
		t.Fatalf("TTL of W0300 = %v", got)
	}
}

// B20: Redis runs with maxmemory-policy volatile-lru and evicts a marker
// that was written and confirmed. The guard refuses the redelivered task
// from the FAILED row (its handler runs 0 times), the daemon warns about
// the policy and sets the gauge, and the lost marker is restored.
func TestCase_B20_EvictedMarker(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	o := newOwnRedis(t, "--maxmemory-policy", "volatile-lru")
	o.reapOne(t, "J20", 14*time.Minute) // reaped 10:31, evicted 10:40, redelivered 10:45
	if got := metricValue(t, o.reg, unsafeGauge, nil); got != 1 {
		t.Fatalf("%s = %v after a pass under volatile-lru, want 1", unsafeGauge, got)
	}
	if n := o.logs.count("maxmemory-policy is not noeviction"); n != 1 {
		t.Fatalf("%d warnings about the eviction policy, want 1", n)
	}
	// The eviction (by hand: which key LRU picks is not ours to choose).
	if err := o.rc.Del(ctx, queue.MarkerKey("J20")).Err(); err != nil {
		t.Fatal(err)
	}
	o.requireGuardRefuses(t, "J20")
	if row := o.db.Read(t, "J20"); row.Status != jobs.StatusFailed || row.Generation != 1 {
		t.Fatalf("J20 after the redelivery = %+v, want FAILED at generation 1", row)
	}
	res, err := runOnce(t, ctx, o.reaper(t, &fakeLister{queues: map[string]asynqstate.ActiveTasks{"q": {}}}, func(opts *reaper.Options) { opts.Once = true }))
	if err != nil || res.MarkersRestored != 1 {
		t.Fatalf("pass = %+v, %v; want J20's marker restored", res, err)
	}
	want := float64(queue.MarkerTTL/time.Second) - (14 * time.Minute).Seconds()
	if got := o.ttl(t, "J20"); got < want-60 || got > want+1 {
		t.Fatalf("TTL of J20's restored marker = %v s, want %v within 60 s", got, want)
	}
}
