package reaper_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/jobreaper/jobreaper/internal/asynqstate"
	"github.com/jobreaper/jobreaper/internal/pgstore"
	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
	"github.com/jobreaper/jobreaper/queue"
	"github.com/jobreaper/jobreaper/reaper"
)

// fakeLister serves fixed active-task lists; the real Inspector lister is
// tested in package queue against real Redis.
type fakeLister struct {
	mu     sync.Mutex
	queues map[string]asynqstate.ActiveTasks
	failed map[string]error
	// statuses answers TaskStatus by task ID; a missing ID is not found.
	statuses map[string]asynqstate.TaskStatus
	// dead names queues no live asynq server serves.
	dead  map[string]bool
	calls int
	// liveCalls counts the reads of the live servers.
	liveCalls int
}

func (f *fakeLister) TaskStatus(_ context.Context, _, id string) (asynqstate.TaskStatus, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if st, ok := f.statuses[id]; ok {
		return st, nil
	}
	return asynqstate.TaskNotFound, nil
}

func (f *fakeLister) Queues(context.Context) ([]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var qs []string
	for q := range f.queues {
		qs = append(qs, q)
	}
	for q := range f.failed {
		qs = append(qs, q)
	}
	return qs, nil
}

func (f *fakeLister) ListActive(_ context.Context, q string) (asynqstate.ActiveTasks, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	if err := f.failed[q]; err != nil {
		return asynqstate.ActiveTasks{}, err
	}
	tasks, ok := f.queues[q]
	if !ok {
		return asynqstate.ActiveTasks{NotFound: true}, nil
	}
	return tasks, nil
}

// countingMarkers counts the marker writes it passes on.
type countingMarkers struct {
	*markerStore
	sets int
}

func (c *countingMarkers) Set(ctx context.Context, jobID string, generation int64, ttl time.Duration) (bool, error) {
	c.sets++
	return c.markerStore.Set(ctx, jobID, generation, ttl)
}

// SetMany counts the writes it sends: those with a TTL of 1 ms or more.
func (c *countingMarkers) SetMany(ctx context.Context, writes []asynqstate.MarkerWrite) []asynqstate.MarkerResult {
	for _, w := range writes {
		if w.TTL.Milliseconds() > 0 {
			c.sets++
		}
	}
	return c.markerStore.SetMany(ctx, writes)
}

// brokenMarkers fails every write, as Redis does during an outage.
type brokenMarkers struct{}

func (brokenMarkers) Set(context.Context, string, int64, time.Duration) (bool, error) {
	return false, errors.New("redis: connection refused")
}

type bundle struct {
	db      *jobstest.DB
	lister  *fakeLister
	redis   *miniredis.Miniredis
	markers *markerStore
	metrics *reaper.Metrics
	reg     *prometheus.Registry
	reaper  *reaper.Reaper
}

func setup(t *testing.T, opts ...func(*reaper.Options)) *bundle {
	t.Helper()
	db := jobstest.New(t)
	db.JobType(t, "report.export", "30 minutes", "", "")
	db.JobType(t, "crawl.site", "60 minutes", "", "")
	mr := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	reg := prometheus.NewRegistry()
	b := &bundle{db: db, markers: newMarkers(t, rdb), lister: &fakeLister{queues: map[string]asynqstate.ActiveTasks{}, failed: map[string]error{}},
		redis: mr, reg: reg, metrics: reaper.NewMetrics(reg)}
	o := reaper.Options{Rule: baselineRule, Logger: testLogger(t), Metrics: b.metrics}
	for _, f := range opts {
		f(&o)
	}
	b.reaper = reaper.New(db.Daemon(), b.lister, b.markers, o)
	return b
}

// markerStore is the daemon's marker writer and the guard's marker reader
// over one Redis: the pass writes through it, the tests read back what a
// guard would see.
type markerStore struct {
	*asynqstate.MarkerWriter
	reader *queue.MarkerStore
}

// Get reads jobID's marker as the start guard does.
func (m *markerStore) Get(ctx context.Context, jobID string) (int64, bool, error) {
	return m.reader.Get(ctx, jobID)
}

func newMarkers(t testing.TB, rdb redis.UniversalClient) *markerStore {
	t.Helper()
	r, err := queue.NewMarkerStore(rdb)
	if err != nil {
		t.Fatal(err)
	}
	return &markerStore{MarkerWriter: asynqstate.NewMarkerWriter(rdb, 0), reader: r}
}

func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// tWriter routes a reaper's log to t.Log, and fails the test when a pass
// logs that its summary does not add up (reaper.ScannedMismatchLog): every
// pass of the tests is checked that way.
type tWriter struct{ t *testing.T }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Log(string(p))
	scanGuard(w).Write(p)
	return len(p), nil
}

// scanGuard fails the test when a pass logs reaper.ScannedMismatchLog; it
// writes nothing anywhere, for the loggers of tests that keep their logs
// in a buffer.
type scanGuard struct{ t *testing.T }

func (g scanGuard) Write(p []byte) (int, error) {
	if bytes.Contains(p, []byte(reaper.ScannedMismatchLog)) {
		g.t.Errorf("a pass's scanned tasks do not add up: %s", p)
	}
	return len(p), nil
}

// runOnce runs one pass of r and fails the test unless its summary adds up
// (Result.CheckScanned).
func runOnce(t *testing.T, ctx context.Context, r *reaper.Reaper) (reaper.Result, error) {
	t.Helper()
	res, err := r.RunOnce(ctx)
	if cerr := res.CheckScanned(); cerr != nil {
		t.Errorf("pass summary: %v", cerr)
	}
	return res, err
}

func (b *bundle) stalled(t *testing.T, id string) {
	b.db.Insert(t, jobstest.Job{ID: id, Type: "report.export", Generation: 1, Queue: "default",
		StartedAgo: jobstest.Ago(31 * time.Minute), IdleAgo: 21 * time.Minute})
}

func TestRunOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("ReapsStalledJobAndLeavesOthers", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.stalled(t, "J5")
		b.db.Insert(t, jobstest.Job{ID: "J12", Type: "crawl.site", Generation: 1,
			StartedAgo: jobstest.Ago(3 * time.Hour), IdleAgo: 2 * time.Minute})
		b.db.Insert(t, jobstest.Job{ID: "fresh", Type: "report.export", Generation: 1,
			StartedAgo: jobstest.Ago(5 * time.Minute), IdleAgo: 5 * time.Minute})
		b.db.Insert(t, jobstest.Job{ID: "odd", Type: "no.such.type", Generation: 1,
			StartedAgo: jobstest.Ago(3 * time.Hour), IdleAgo: time.Hour})
		b.lister.queues["default"] = asynqstate.ActiveTasks{IDs: []string{"J5", "J12", "fresh", "odd", "ghost"}, EmptyIDs: 2}
		before12, beforeFresh := b.db.Read(t, "J12"), b.db.Read(t, "fresh")

		res, err := runOnce(t, ctx, b.reaper)
		if err != nil {
			t.Fatal(err)
		}
		want := map[string]int{"progressing": 1, "within_limit": 1, "unknown_type": 1, "no_row": 1, "no_job_id": 2}
		if res.Scanned != 7 || res.Reaped != 1 || res.Errors != 0 || !equalCounts(res.Skipped, want) {
			t.Fatalf("result = %+v, want scanned 7 reaped 1 skipped %v", res, want)
		}
		if row := b.db.Read(t, "J5"); row.Status != jobs.StatusFailed || row.FailureReason != "stalled" {
			t.Fatalf("J5 = %+v", row)
		}
		if got := b.db.Read(t, "J12"); got != before12 {
			t.Fatalf("J12 changed: %+v -> %+v", before12, got)
		}
		if got := b.db.Read(t, "fresh"); got != beforeFresh {
			t.Fatalf("fresh changed: %+v -> %+v", beforeFresh, got)
		}
		if v, err := b.redis.Get("jobreaper:reaped:J5"); err != nil || v != "1" {
			t.Fatalf("marker = %q, %v; want generation 1", v, err)
		}
		if ttl := b.redis.TTL("jobreaper:reaped:J5"); ttl != queue.MarkerTTL {
			t.Fatalf("marker TTL = %v, want %v", ttl, queue.MarkerTTL)
		}
		if b.redis.Exists("jobreaper:reaped:J12") {
			t.Fatal("J12 got a marker")
		}
		var recorded bool
		if err := b.db.Pool.QueryRow(ctx, `SELECT marker_set_at IS NOT NULL FROM jobs WHERE id = 'J5'`).Scan(&recorded); err != nil || !recorded {
			t.Fatalf("J5 marker_set_at recorded = %v (%v), want true", recorded, err)
		}
		if got := metricValue(t, b.reg, "jobreaper_jobs_reaped_total", map[string]string{"reason": "stalled", "type": "report.export", "queue": "default"}); got != 1 {
			t.Fatalf("jobreaper_jobs_reaped_total = %v, want 1", got)
		}
		// The reason series without type and queue stay at 0.
		if got := metricValue(t, b.reg, "jobreaper_jobs_reaped_total", map[string]string{"reason": "stalled", "type": "", "queue": ""}); got != 0 {
			t.Fatalf("jobreaper_jobs_reaped_total{reason=stalled,type=\"\",queue=\"\"} = %v, want 0", got)
		}
	})

	t.Run("QueueThatFailsToListIsAnErrorAndItsTasksAreUntouched", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.stalled(t, "J1")
		b.stalled(t, "J2")
		b.lister.queues["ok"] = asynqstate.ActiveTasks{IDs: []string{"J1"}}
		b.lister.failed["broken"] = errors.New("redis: i/o timeout")
		res, err := runOnce(t, ctx, b.reaper)
		if err != nil {
			t.Fatal(err)
		}
		if res.Errors != 1 || res.Reaped != 1 || res.Scanned != 1 {
			t.Fatalf("result = %+v, want 1 error, 1 reaped, 1 scanned", res)
		}
		if row := b.db.Read(t, "J2"); row.Status != jobs.StatusProcessing {
			t.Fatalf("J2 of the failed queue = %+v, want untouched", row)
		}
	})

	t.Run("UnknownQueueIsEmptyWithWarningAndCounter", func(t *testing.T) {
		t.Parallel()
		b := setup(t, func(o *reaper.Options) { o.Queues = []string{"typo"} })
		res, err := runOnce(t, ctx, b.reaper)
		if err != nil || res.Errors != 0 || res.Scanned != 0 || !slices.Equal(res.QueuesNotFound, []string{"typo"}) {
			t.Fatalf("result = %+v, err = %v; want no error, nothing scanned, queues_not_found [typo]", res, err)
		}
		if got := metricValue(t, b.reg, "jobreaper_queue_not_found_total", map[string]string{"queue": "typo"}); got != 1 {
			t.Fatalf("jobreaper_queue_not_found_total{queue=typo} = %v, want 1", got)
		}
	})

	t.Run("ConfiguredQueuesAreTheOnlyOnesListed", func(t *testing.T) {
		t.Parallel()
		b := setup(t, func(o *reaper.Options) { o.Queues = []string{"a"} })
		b.stalled(t, "J1")
		b.lister.queues["a"] = asynqstate.ActiveTasks{}
		b.lister.queues["b"] = asynqstate.ActiveTasks{IDs: []string{"J1"}}
		if res, err := runOnce(t, ctx, b.reaper); err != nil || res.Reaped != 0 || b.lister.calls != 1 {
			t.Fatalf("result = %+v, err = %v, list calls = %d", res, err, b.lister.calls)
		}
	})

	t.Run("MarkerFailureIsCountedAndRowStillFailed", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.stalled(t, "J1")
		b.lister.queues["default"] = asynqstate.ActiveTasks{IDs: []string{"J1"}}
		r := reaper.New(b.db.Daemon(), b.lister, brokenMarkers{},
			reaper.Options{Rule: baselineRule, Logger: testLogger(t), Metrics: b.metrics})
		res, err := runOnce(t, ctx, r)
		if err != nil || res.Reaped != 1 || res.Errors != 1 {
			t.Fatalf("result = %+v, err = %v; want reaped 1, errors 1", res, err)
		}
		if row := b.db.Read(t, "J1"); row.Status != jobs.StatusFailed {
			t.Fatalf("J1 = %+v", row)
		}
		// Redis is back: the next pass re-sets the marker with what is left
		// of its 7 days (here the reap is 2 hours old), and records it.
		b.db.Exec(t, `UPDATE jobs SET finished_at = finished_at - interval '2 hours' WHERE id = 'J1'`)
		counting := &countingMarkers{markerStore: b.markers}
		r = reaper.New(b.db.Daemon(), b.lister, counting,
			reaper.Options{Rule: baselineRule, Logger: testLogger(t), Metrics: b.metrics})
		if res, err := runOnce(t, ctx, r); err != nil || res.Errors != 0 || res.Reaped != 0 {
			t.Fatalf("repair pass result = %+v, err = %v", res, err)
		}
		if v, err := b.redis.Get(queue.MarkerKey("J1")); err != nil || v != "1" {
			t.Fatalf("repaired marker = %q, %v; want generation 1", v, err)
		}
		if ttl := b.redis.TTL(queue.MarkerKey("J1")); ttl > queue.MarkerTTL-2*time.Hour || ttl < queue.MarkerTTL-2*time.Hour-time.Minute {
			t.Fatalf("repaired marker TTL = %v, want 7 days minus the 2 hours since the reap", ttl)
		}
		if got := metricValue(t, b.reg, "jobreaper_markers_repaired_total", map[string]string{"cause": "write_failed"}); got != 1 {
			t.Fatalf("jobreaper_markers_repaired_total = %v, want 1", got)
		}
		if _, err := runOnce(t, ctx, r); err != nil || counting.sets != 1 {
			t.Fatalf("marker writes after a third pass = %d (err %v), want still 1: a repaired marker is recorded", counting.sets, err)
		}
	})

	t.Run("DatabaseDownMeansThePassCouldNotRun", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.stalled(t, "J1")
		b.lister.queues["default"] = asynqstate.ActiveTasks{IDs: []string{"J1"}}
		b.db.Pool.Close()
		res, err := runOnce(t, ctx, b.reaper)
		if !errors.Is(err, reaper.ErrPassFailed) || res.Reaped != 0 || b.lister.calls != 0 {
			t.Fatalf("result = %+v, err = %v, list calls = %d; want ErrPassFailed before listing", res, err, b.lister.calls)
		}
	})

	t.Run("CompareAndSetLossIsCountedAsChangedSinceRead", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.stalled(t, "J1")
		b.lister.queues["default"] = asynqstate.ActiveTasks{IDs: []string{"J1"}}
		// The job progresses between the pass's read and its reap.
		store := &progressingStore{Store: b.db.Daemon(), db: b.db, t: t}
		r := reaper.New(store, b.lister, b.markers,
			reaper.Options{Rule: baselineRule, Logger: testLogger(t)})
		res, err := runOnce(t, ctx, r)
		if err != nil || res.Reaped != 0 || res.Skipped["changed_since_read"] != 1 {
			t.Fatalf("result = %+v, err = %v", res, err)
		}
		if row := b.db.Read(t, "J1"); row.Status != jobs.StatusProcessing {
			t.Fatalf("J1 = %+v", row)
		}
		if b.redis.Exists("jobreaper:reaped:J1") {
			t.Fatal("a marker was set for a job that was not reaped")
		}
	})
}

// progressingStore moves the job's updated_at after the pass read it.
type progressingStore struct {
	*pgstore.Store
	db *jobstest.DB
	t  *testing.T
}

func (s *progressingStore) LoadForTasks(ctx context.Context, ids []string) (map[string]jobs.Snapshot, error) {
	snaps, err := s.Store.LoadForTasks(ctx, ids)
	s.db.Exec(s.t, `UPDATE jobs SET updated_at = now()`)
	return snaps, err
}

func TestStartStop(t *testing.T) {
	t.Parallel()

	t.Run("StopWithoutStartReturns", func(t *testing.T) {
		t.Parallel()
		reaper.New(nil, nil, nil, reaper.Options{}).Stop()
	})

	t.Run("LoopRunsAPassAtStartAndStopsOnStop", func(t *testing.T) {
		t.Parallel()
		b := setup(t, func(o *reaper.Options) { o.Interval = time.Hour })
		b.stalled(t, "J1")
		b.lister.queues["default"] = asynqstate.ActiveTasks{IDs: []string{"J1"}}
		if err := b.reaper.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		if err := b.reaper.Start(context.Background()); !errors.Is(err, reaper.ErrAlreadyStarted) {
			t.Fatalf("second Start = %v, want ErrAlreadyStarted", err)
		}
		// Wait for the first pass to end, not just for its reap: a pass
		// stopped midway counts as cancelled, never ok.
		jobstest.Eventually(t, "the first pass reaped J1 and ended", func() bool {
			return metricValue(t, b.reg, "jobreaper_passes_total", map[string]string{"outcome": "ok"}) == 1
		})
		if got := b.db.Read(t, "J1").Status; got != jobs.StatusFailed {
			t.Fatalf("J1 = %s, want FAILED", got)
		}
		b.reaper.Stop()
		b.reaper.Stop()
		if got := metricValue(t, b.reg, "jobreaper_passes_total", map[string]string{"outcome": "ok"}); got != 1 {
			t.Fatalf("passes = %v, want 1 (interval is an hour)", got)
		}
	})
}

func equalCounts(got, want map[string]int) bool {
	if len(got) != len(want) {
		return false
	}
	for k, v := range want {
		if got[k] != v {
			return false
		}
	}
	return true
}

// TaskStatuses answers from statuses, as TaskStatus does.
func (f *fakeLister) TaskStatuses(ctx context.Context, refs []asynqstate.TaskRef) ([]asynqstate.TaskStatus, error) {
	out := make([]asynqstate.TaskStatus, len(refs))
	for i, ref := range refs {
		out[i], _ = f.TaskStatus(ctx, ref.Queue, ref.ID)
	}
	return out, nil
}

// LiveQueues says every queue the lister has is served by a live server,
// unless dead names it.
func (f *fakeLister) LiveQueues(context.Context) (map[string]bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.liveCalls++
	live := map[string]bool{}
	for q := range f.queues {
		live[q] = !f.dead[q]
	}
	return live, nil
}
