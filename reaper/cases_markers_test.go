package reaper_test

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/jobreaper/jobreaper/internal/asynqstate"
	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
	"github.com/jobreaper/jobreaper/queue"
	"github.com/jobreaper/jobreaper/reaper"
)

// logBuffer keeps the log lines of one pass for assertions, and passes
// them on to t.Log.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

// take returns the lines written since the last take.
func (l *logBuffer) take() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.buf.String()
	l.buf.Reset()
	return strings.Split(strings.TrimSpace(s), "\n")
}

func countLines(lines []string, parts ...string) int {
	n := 0
line:
	for _, l := range lines {
		for _, p := range parts {
			if !strings.Contains(l, p) {
				continue line
			}
		}
		n++
	}
	return n
}

// B38: some other tool wrote jobreaper:reaped:X = "yes". X and Y are both
// reaped while Redis is down, so both marker writes fail; Redis comes back.
// The next pass restores Y's marker with what is left of its 7 days, and
// counts X as one error naming its key; one bad item never ends the loop.
func TestCase_B38_OneBadMarkerKeyDoesNotStopTheRepair(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := jobstest.New(t)
	db.JobType(t, "report.export", "30 minutes", "", "")
	a := newRealAsynq(t)
	q := "b38-" + a.suffix
	// Two pairs cover both orders of the repair (oldest reap first): X1
	// comes first, X2 last.
	x1, y1 := "X1-"+a.suffix, "Y1-"+a.suffix
	x2, y2 := "X2-"+a.suffix, "Y2-"+a.suffix
	a.serveBlocking(t, []string{q}, x1, y1, x2, y2)
	for _, id := range []string{x1, y1, x2, y2} {
		db.Insert(t, jobstest.Job{ID: id, Type: "report.export", Generation: 1, Queue: q,
			StartedAgo: jobstest.Ago(31 * time.Minute), IdleAgo: 21 * time.Minute})
	}
	a.activate(t, q, x1, y1, x2, y2)
	lister, err := asynqstate.NewInspectorLister(a.insp)
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	metrics := reaper.NewMetrics(reg)
	logs := &logBuffer{}
	newReaper := func(rc redis.UniversalClient) *reaper.Reaper {
		markers := asynqstate.NewMarkerWriter(rc, 2*time.Second)
		log := slog.New(slog.NewTextHandler(io.MultiWriter(tWriter{t}, logs), &slog.HandlerOptions{Level: slog.LevelDebug}))
		// The live server serveBlocking runs serves q in a.rc: marker
		// repair is not held.
		return reaper.New(db.Daemon(), lister, markers, reaper.Options{Queues: []string{q}, Rule: baselineRule, Logger: log, Metrics: metrics,
			Asynq: asynqstate.NewStatusReader(a.rc, 0)})
	}
	markersFailed := func() float64 { return metricValue(t, reg, "jobreaper_markers_failed_total", nil) }

	// Redis is down for the marker writes (nothing listens on port 1).
	down := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", ContextTimeoutEnabled: true, MaxRetries: -1})
	t.Cleanup(func() { _ = down.Close() })
	res, err := runOnce(t, ctx, newReaper(down))
	if err != nil || res.Reaped != 4 || res.Errors != 4 {
		t.Fatalf("pass while Redis is down = %+v, err %v; want 4 reaped and 4 marker errors", res, err)
	}
	if got := markersFailed(); got != 4 {
		t.Fatalf("jobreaper_markers_failed_total = %v, want 4", got)
	}
	// The reaps move 10 s into the past, 1 ms apart: X1, Y1, Y2, X2.
	db.Exec(t, `UPDATE jobs SET finished_at = now() - interval '10 seconds' - (ord * interval '1 millisecond')
  FROM (VALUES ($1::text, 4), ($2, 3), ($3, 1), ($4, 2)) AS o(id, ord) WHERE jobs.id = o.id`, x1, y1, x2, y2)
	logs.take()

	// Redis is back; some other tool wrote "yes" into the X keys.
	for _, x := range []string{x1, x2} {
		if err := a.rc.Set(ctx, queue.MarkerKey(x), "yes", 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	up := newReaper(a.rc)
	for pass := 1; pass <= 2; pass++ {
		res, err = runOnce(t, ctx, up)
		if err != nil || res.Reaped != 0 || res.Errors != 2 {
			t.Fatalf("pass %d after Redis came back = %+v, err %v; want 2 errors (X1, X2) and nothing reaped", pass, res, err)
		}
		lines := logs.take()
		for _, x := range []string{x1, x2} {
			if n := countLines(lines, "level=ERROR", "key="+queue.MarkerKey(x)); n != 1 {
				t.Fatalf("pass %d logged %d errors naming %s, want 1:\n%s", pass, n, queue.MarkerKey(x), strings.Join(lines, "\n"))
			}
			if v, _ := a.rc.Get(ctx, queue.MarkerKey(x)).Result(); v != "yes" {
				t.Fatalf("%s was overwritten with %q", queue.MarkerKey(x), v)
			}
		}
		if got, want := markersFailed(), float64(4+2*pass); got != want {
			t.Fatalf("pass %d: jobreaper_markers_failed_total = %v, want %v", pass, got, want)
		}
	}
	// Both Ys were restored in the first pass after Redis came back, once.
	if got := metricValue(t, reg, "jobreaper_markers_repaired_total", map[string]string{"cause": "write_failed"}); got != 2 {
		t.Fatalf("jobreaper_markers_repaired_total = %v, want 2", got)
	}
	store, err := queue.NewMarkerStore(a.rc)
	if err != nil {
		t.Fatal(err)
	}
	for _, y := range []string{y1, y2} {
		g, found, err := store.Get(ctx, y)
		if err != nil || !found || g != 1 {
			t.Fatalf("marker of %s: generation %d, found %v, err %v; want generation 1", y, g, found, err)
		}
		ttl := a.rc.TTL(ctx, queue.MarkerKey(y)).Val()
		if ttl > queue.MarkerTTL-10*time.Second || ttl < queue.MarkerTTL-70*time.Second {
			t.Fatalf("TTL of %s = %s, want 7 days minus the ~10 s since its reap (within 60 s)", y, ttl)
		}
	}
	requireNoMarkerSetAt(t, db, x1, x2)
}

func requireNoMarkerSetAt(t *testing.T, db *jobstest.DB, ids ...string) {
	t.Helper()
	for _, id := range ids {
		if n := db.Count(t, `SELECT count(*) FROM jobs WHERE id = $1 AND marker_set_at IS NULL AND status = $2`, id, jobs.StatusFailed); n != 1 {
			t.Fatalf("%s: its marker is recorded as written, or it is not FAILED", id)
		}
	}
}
