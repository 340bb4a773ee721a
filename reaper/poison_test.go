package reaper_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/jobreaper/jobreaper/internal/asynqstate"
	"github.com/jobreaper/jobreaper/internal/pgstore"
	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
	"github.com/jobreaper/jobreaper/reaper"
)

// Kind 2, another loop than B33's and B38's: one job whose on_failed
// cascade fails (its parent's CHECK refuses the change) is an error of the
// pass for that job alone; the other stalled jobs of the same pass, of the
// same type, are reaped with their cascades.
func TestReapOneFailingCascadeDoesNotStopTheOthers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := jobstest.New(t)
	db.JobType(t, "report.export", "30 minutes", "", "")
	db.Exec(t, `CREATE TABLE parents (id text PRIMARY KEY, failed int NOT NULL DEFAULT 0, cap int NOT NULL, CHECK (failed <= cap))`)
	db.Exec(t, `INSERT INTO parents (id, cap) VALUES ('full', 0), ('P', 10)`)
	cascades := jobs.Cascades{"report.export": {OnFailed: []string{
		`UPDATE ` + db.Schema + `.parents SET failed = failed + 1 WHERE id = @parent_id`,
	}}}
	store := db.Daemon(pgstore.WithCascades(cascades))
	if err := store.PrepareCascades(ctx); err != nil {
		t.Fatal(err)
	}
	for id, parent := range map[string]string{"A": "P", "bad": "full", "C": "P"} {
		db.Insert(t, jobstest.Job{ID: id, Type: "report.export", Generation: 1, Queue: "default", ParentID: parent,
			StartedAgo: jobstest.Ago(31 * time.Minute), IdleAgo: 21 * time.Minute})
	}
	lister := &fakeLister{queues: map[string]asynqstate.ActiveTasks{"default": {IDs: []string{"A", "bad", "C"}}}, failed: map[string]error{}}
	reg := prometheus.NewRegistry()
	r := reaper.New(store, lister, newMarkers(t, miniRedisClient(t)), reaper.Options{Rule: baselineRule, Logger: testLogger(t),
		Metrics: reaper.NewMetrics(reg)})
	res, err := runOnce(t, ctx, r)
	if err != nil || res.Reaped != 2 || res.Errors != 1 {
		t.Fatalf("result = %+v, err %v; want A and C reaped and one error for bad", res, err)
	}
	for id, want := range map[string]string{"A": jobs.StatusFailed, "C": jobs.StatusFailed, "bad": jobs.StatusProcessing} {
		if got := db.Read(t, id).Status; got != want {
			t.Fatalf("%s = %s, want %s", id, got, want)
		}
	}
	if n := db.Count(t, `SELECT failed FROM parents WHERE id = 'P'`); n != 2 {
		t.Fatalf("parent P counts %d failed children, want 2 (one cascade each for A and C)", n)
	}
	if n := db.Events(t, "bad", "reaped"); n != 0 {
		t.Fatalf("bad has %d reaped events, want 0", n)
	}
	if got := metricValue(t, reg, "jobreaper_pass_errors_total", map[string]string{"stage": "reap"}); got != 1 {
		t.Fatalf("reap errors = %v, want 1", got)
	}
}

// hookedStore runs a hook before ListMissingMarkers, the first database
// read of a pass after the clock.
type hookedStore struct {
	*pgstore.Store
	beforeRepair func() error
}

func (h *hookedStore) ListMissingMarkers(ctx context.Context, now time.Time, within time.Duration, limit int) ([]pgstore.MissingMarker, error) {
	if err := h.beforeRepair(); err != nil {
		return nil, err
	}
	return h.Store.ListMissingMarkers(ctx, now, within, limit)
}

// Item 9: a pass cut short by a shutdown is not ok and does not move the
// last-success time; a database read that fails is a pass error of stage
// load, never a failed marker write.
func TestPassOutcomeMetrics(t *testing.T) {
	t.Parallel()

	run := func(t *testing.T, hook func(cancel context.CancelFunc) error) (reaper.Result, *prometheus.Registry) {
		t.Helper()
		db := jobstest.New(t)
		db.JobType(t, "report.export", "30 minutes", "", "")
		db.Insert(t, jobstest.Job{ID: "J1", Type: "report.export", Generation: 1, Queue: "default",
			StartedAgo: jobstest.Ago(31 * time.Minute), IdleAgo: 21 * time.Minute})
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		reg := prometheus.NewRegistry()
		lister := &fakeLister{queues: map[string]asynqstate.ActiveTasks{"default": {IDs: []string{"J1"}}}, failed: map[string]error{}}
		r := reaper.New(&hookedStore{Store: db.Daemon(), beforeRepair: func() error { return hook(cancel) }}, lister,
			newMarkers(t, miniRedisClient(t)), reaper.Options{Rule: baselineRule, Logger: testLogger(t), Metrics: reaper.NewMetrics(reg)})
		res, err := runOnce(t, ctx, r)
		if err != nil {
			t.Fatalf("RunOnce: %v", err)
		}
		return res, reg
	}
	passes := func(reg *prometheus.Registry, outcome string) float64 {
		return metricValue(t, reg, "jobreaper_passes_total", map[string]string{"outcome": outcome})
	}

	t.Run("PassStoppedByShutdownIsCancelledNotOK", func(t *testing.T) {
		t.Parallel()
		res, reg := run(t, func(cancel context.CancelFunc) error { cancel(); return nil })
		if res.Errors != 0 || res.Reaped != 0 || !res.Interrupted {
			t.Fatalf("result = %+v, want no errors counted, nothing reaped after the cancel, and interrupted", res)
		}
		if ok, cancelled := passes(reg, "ok"), passes(reg, "cancelled"); ok != 0 || cancelled != 1 {
			t.Fatalf("passes ok = %v, cancelled = %v; want 0 and 1", ok, cancelled)
		}
		if got := metricValue(t, reg, "jobreaper_last_success_timestamp_seconds", nil); got != 0 {
			t.Fatalf("jobreaper_last_success_timestamp_seconds = %v, want 0 (never moved)", got)
		}
	})

	// A stop that comes before the pass could read the clock ends it with
	// an error, and it is still an interrupted pass: run --once prints its
	// (empty) summary and exits 1 rather than saying it could not run.
	t.Run("PassStoppedBeforeItsClockReadIsInterrupted", func(t *testing.T) {
		t.Parallel()
		db := jobstest.New(t)
		reg := prometheus.NewRegistry()
		r := reaper.New(db.Daemon(), &fakeLister{queues: map[string]asynqstate.ActiveTasks{}, failed: map[string]error{}},
			newMarkers(t, miniRedisClient(t)), reaper.Options{Rule: baselineRule, Logger: testLogger(t), Metrics: reaper.NewMetrics(reg)})
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		res, err := runOnce(t, ctx, r)
		if !errors.Is(err, reaper.ErrPassFailed) || !res.Interrupted || res.Scanned != 0 || res.Reaped != 0 {
			t.Fatalf("RunOnce after the stop = %+v, %v; want ErrPassFailed, interrupted, nothing scanned", res, err)
		}
		if cancelled, failed := passes(reg, "cancelled"), passes(reg, "failed"); cancelled != 1 || failed != 0 {
			t.Fatalf("passes cancelled = %v, failed = %v; want 1 and 0", cancelled, failed)
		}
	})

	t.Run("CleanPassMovesTheLastSuccessTime", func(t *testing.T) {
		t.Parallel()
		before := float64(time.Now().Unix())
		res, reg := run(t, func(context.CancelFunc) error { return nil })
		if res.Errors != 0 || res.Reaped != 1 || res.Interrupted || passes(reg, "ok") != 1 {
			t.Fatalf("result = %+v, ok passes %v; want one clean, whole pass reaping J1", res, passes(reg, "ok"))
		}
		if got := metricValue(t, reg, "jobreaper_last_success_timestamp_seconds", nil); got < before {
			t.Fatalf("jobreaper_last_success_timestamp_seconds = %v, want at least %v", got, before)
		}
	})

	t.Run("DatabaseReadFailureIsALoadErrorNotAMarkerFailure", func(t *testing.T) {
		t.Parallel()
		res, reg := run(t, func(context.CancelFunc) error { return errors.New("conn closed") })
		if res.Errors != 1 || res.Reaped != 1 || passes(reg, "errors") != 1 {
			t.Fatalf("result = %+v; want one error, and J1 still reaped", res)
		}
		if got := metricValue(t, reg, "jobreaper_markers_failed_total", nil); got != 0 {
			t.Fatalf("jobreaper_markers_failed_total = %v, want 0", got)
		}
		for stage, want := range map[string]float64{"load": 1, "marker": 0} {
			if got := metricValue(t, reg, "jobreaper_pass_errors_total", map[string]string{"stage": stage}); got != want {
				t.Fatalf("pass errors of stage %s = %v, want %v", stage, got, want)
			}
		}
		if got := metricValue(t, reg, "jobreaper_last_success_timestamp_seconds", nil); got != 0 {
			t.Fatalf("jobreaper_last_success_timestamp_seconds = %v, want 0", got)
		}
	})
}

// miniRedisClient returns a client of a fresh miniredis, both closed at
// cleanup.
func miniRedisClient(t *testing.T) *redis.Client {
	t.Helper()
	mr := miniredis.RunT(t)
	rc := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { _ = rc.Close() })
	return rc
}

// B33's rule holds for every ID jobs.CheckID refuses: invalid UTF-8 and
// IDs over jobs.MaxIDLength are skipped as bad_job_id (one warning per
// queue), and the stalled job listed with them is reaped.
func TestBadTaskIDsAreSkippedBeforeTheLoad(t *testing.T) {
	t.Parallel()
	logs := &logBuffer{}
	b := setup(t, func(o *reaper.Options) {
		o.Logger = slog.New(slog.NewTextHandler(io.MultiWriter(tWriter{t}, logs), nil))
	})
	b.stalled(t, "J1")
	long := strings.Repeat("L", jobs.MaxIDLength+1)
	b.lister.queues["default"] = asynqstate.ActiveTasks{IDs: []string{"bad\xff", "J1", long}}
	b.lister.queues["other"] = asynqstate.ActiveTasks{IDs: []string{"nul\x00"}}
	res, err := runOnce(t, context.Background(), b.reaper)
	if err != nil || res.Reaped != 1 || res.Errors != 0 || res.Scanned != 4 || !equalCounts(res.Skipped, map[string]int{"bad_job_id": 3}) {
		t.Fatalf("result = %+v, err %v; want J1 reaped and 3 IDs skipped as bad_job_id", res, err)
	}
	if got := b.db.Read(t, "J1").Status; got != jobs.StatusFailed {
		t.Fatalf("J1 = %s, want FAILED", got)
	}
	lines := logs.take()
	for q, want := range map[string]string{"default": `job_ids="\"bad\\xff\" \"LLLL`, "other": `job_ids="\"nul\\x00\""`} {
		if n := countLines(lines, "level=WARN", "queue="+q+" reason=bad_job_id"); n != 1 {
			t.Fatalf("%d warnings for queue %s, want 1:\n%s", n, q, strings.Join(lines, "\n"))
		}
		if n := countLines(lines, "queue="+q+" reason=bad_job_id", want); n != 1 {
			t.Fatalf("the warning for queue %s does not show the IDs escaped (%s):\n%s", q, want, strings.Join(lines, "\n"))
		}
	}
	// The lister's lists are the caller's: the filter leaves them as they were.
	if ids := b.lister.queues["default"].IDs; len(ids) != 3 || ids[0] != "bad\xff" {
		t.Fatalf("the lister's list was modified: %q", ids)
	}
}
