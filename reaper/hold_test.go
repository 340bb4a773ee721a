package reaper_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/jobreaper/jobreaper/internal/asynqstate"
	"github.com/jobreaper/jobreaper/internal/pgcore"
	"github.com/jobreaper/jobreaper/internal/pgstore"
	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
	"github.com/jobreaper/jobreaper/queue"
	"github.com/jobreaper/jobreaper/queue/queuetest"
	"github.com/jobreaper/jobreaper/reaper"
)

// stormWorld is one stall-storm test's database and share of the real
// Redis: jobs rows backdated as stalled or running, their tasks active in
// asynq's own keys (queuetest.MakeActive), listed by the ID lister.
type stormWorld struct {
	db      *jobstest.DB
	a       *realAsynq
	lister  *asynqstate.IDLister
	markers *markerStore
	logs    *logBuffer
}

// stormLimits are the defaults of max_stalled_per_pass and
// max_stalled_fraction.
func stormLimits(o *reaper.Options) { o.MaxStalledPerPass, o.MaxStalledFraction = 100, 0.5 }

func newStormWorld(t *testing.T) *stormWorld {
	t.Helper()
	w := &stormWorld{db: jobstest.New(t), a: newRealAsynq(t), logs: &logBuffer{}}
	// report.export stalls after the daemon's 15 minutes, crawl.site after
	// its own 20: a hold lasts the longest of the held types'.
	w.db.JobType(t, "report.export", "30 minutes", "", "")
	w.db.JobType(t, "crawl.site", "60 minutes", "20 minutes", "")
	var err error
	if w.lister, err = asynqstate.NewIDLister(w.a.rc); err != nil {
		t.Fatal(err)
	}
	w.markers = newMarkers(t, w.a.rc)
	return w
}

// queue returns a queue name unique to the test, whose keys and job
// markers are removed at cleanup.
func (w *stormWorld) queue(t *testing.T, name string) string {
	t.Helper()
	q := name + "-" + w.a.suffix
	t.Cleanup(func() {
		ctx := context.WithoutCancel(t.Context())
		_ = queuetest.Remove(ctx, w.a.rc, q)
		if keys, err := w.a.rc.Keys(ctx, queue.MarkerKey(q+"-*")).Result(); err == nil && len(keys) > 0 {
			w.a.rc.Del(ctx, keys...)
		}
	})
	return q
}

// add inserts n PROCESSING jobs of typ in q, named q-prefix-NNNN, started
// started ago and last moved idle ago, and makes their tasks active.
func (w *stormWorld) add(t *testing.T, q, typ, prefix string, n int, started, idle time.Duration) []string {
	t.Helper()
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("%s-%s-%04d", q, prefix, i)
	}
	w.db.Exec(t, `INSERT INTO jobs (id, type, status, generation, worker, queue, started_at, updated_at)
SELECT id, $2, 'PROCESSING', 1, 'w1', $3, now() - $4::interval, now() - $5::interval FROM unnest($1::text[]) AS id`,
		ids, typ, q, pgcore.Interval(started), pgcore.Interval(idle))
	if err := queuetest.MakeActive(t.Context(), w.a.rc, q, typ, ids); err != nil {
		t.Fatal(err)
	}
	return ids
}

// stalled adds n jobs of typ stalled by its rule (past max_runtime, idle
// longer than its stall timeout).
func (w *stormWorld) stalled(t *testing.T, q, typ, prefix string, n int) []string {
	started := 31 * time.Minute
	if typ == "crawl.site" {
		started = 61 * time.Minute
	}
	return w.add(t, q, typ, prefix, n, started, 21*time.Minute)
}

// running adds n report.export jobs past max_runtime whose last progress
// was a minute ago.
func (w *stormWorld) running(t *testing.T, q, prefix string, n int) []string {
	return w.add(t, q, "report.export", prefix, n, 31*time.Minute, time.Minute)
}

// moved sets the last progress of ids ago before now: 21 minutes makes
// them stall, 0 is progress now.
func (w *stormWorld) moved(t *testing.T, ago time.Duration, ids []string) {
	t.Helper()
	w.db.Exec(t, `UPDATE jobs SET updated_at = now() - $2::interval WHERE id = ANY($1)`, ids, pgcore.Interval(ago))
}

// reaper returns a Reaper over w on queues and its metrics registry.
func (w *stormWorld) reaper(t *testing.T, queues []string, set ...func(*reaper.Options)) (*reaper.Reaper, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	o := reaper.Options{Queues: queues, Rule: baselineRule, Metrics: reaper.NewMetrics(reg), Asynq: asynqstate.NewStatusReader(w.a.rc, 0),
		Logger: slog.New(slog.NewTextHandler(io.MultiWriter(tWriter{t}, w.logs), &slog.HandlerOptions{Level: slog.LevelDebug}))}
	for _, f := range set {
		f(&o)
	}
	return reaper.New(w.db.Daemon(), w.lister, w.markers, o), reg
}

// holds returns every reaper_holds row, in ID order.
func (w *stormWorld) holds(t *testing.T) []pgstore.Hold {
	t.Helper()
	var out []pgstore.Hold
	rows, err := w.db.Pool.Query(t.Context(), `SELECT id, queues, types, held, judged, tripped, started_at, until,
       released_at, coalesce(released_by, ''), coalesce(reason, ''), drained FROM reaper_holds ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var h pgstore.Hold
		if err := rows.Scan(&h.ID, &h.Queues, &h.Types, &h.Held, &h.Judged, &h.Tripped, &h.StartedAt, &h.Until,
			&h.ReleasedAt, &h.ReleasedBy, &h.Reason, &h.Drained); err != nil {
			t.Fatal(err)
		}
		out = append(out, h)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// endHolds moves the end of every hold to now on the database clock, as
// the hold's duration running out does.
func (w *stormWorld) endHolds(t *testing.T) {
	t.Helper()
	w.db.Exec(t, `UPDATE reaper_holds SET until = greatest(started_at, now()) WHERE until > now()`)
}

// countStatus counts ids in status.
func (w *stormWorld) countStatus(t *testing.T, ids []string, status string) int64 {
	t.Helper()
	return w.db.Count(t, `SELECT count(*) FROM jobs WHERE id = ANY($1) AND status = $2`, ids, status)
}

// A pass that finds 200 active jobs stalled at once (150 report.export in
// one queue, 50 crawl.site in another, beside 20 running jobs) reaps none:
// it records one hold on both queues, with their types, the count and
// the share it judged, lasting crawl.site's 20-minute stall timeout (the
// longest of the held types'), and says so in a WARN line, the Result,
// the metrics. While the hold lasts, a replica on another queue set that
// shares one held queue holds that queue's jobs whatever its own (absent)
// limits, and reaps its other queue; a Reaper that takes over mid-hold
// holds them too and starts no second hold; jobs that start stalling are
// held with the rest. Once the hold ends, the first pass reaps every job
// still stalled, 175 of them, in that one pass, without the storm check;
// the 30 that made progress during the hold stay PROCESSING. The next
// storm in those queues starts a new hold.
func TestStallStorm_TwoHundredJobsAreHeldThenReapedTogether(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	w := newStormWorld(t)
	qa, qb, qc := w.queue(t, "storm-a"), w.queue(t, "storm-b"), w.queue(t, "storm-c")
	exports := w.stalled(t, qa, "report.export", "s", 150)
	crawls := w.stalled(t, qb, "crawl.site", "s", 50)
	running := w.running(t, qa, "r", 20)
	r1, reg1 := w.reaper(t, []string{qa, qb}, stormLimits)

	res, err := runOnce(t, ctx, r1)
	if err != nil || res.Reaped != 0 || res.StallStormHeld != 200 || res.Skipped["stall_storm_held"] != 200 ||
		res.ScannedBy["stall_storm_held"] != 200 || res.ScannedBy["progressing"] != 20 || res.Errors != 0 {
		t.Fatalf("storm pass = %+v, %v; want 200 held, 20 progressing, none reaped", res, err)
	}
	holds := w.holds(t)
	if len(holds) != 1 {
		t.Fatalf("%d hold rows, want 1: %+v", len(holds), holds)
	}
	h := holds[0]
	if !slices.Equal(h.Queues, []string{qa, qb}) || !slices.Equal(h.Types, []string{"crawl.site", "report.export"}) ||
		h.Held != 200 || h.Judged != 220 || !strings.Contains(h.Tripped, "more than max_stalled_per_pass 100") ||
		h.Until.Sub(h.StartedAt) != 20*time.Minute || h.ReleasedAt != nil || len(h.Drained) != 0 {
		t.Fatalf("hold = %+v; want queues %s,%s, both types, 200 held of 220, 20 minutes", h, qa, qb)
	}
	if len(res.StallStormHolds) != 1 || res.StallStormHolds[0].ID != h.ID || !res.StallStormHolds[0].Started || res.StallStormHolds[0].Held != 200 {
		t.Fatalf("stall_storm_holds = %+v, want the hold just started, 200 held", res.StallStormHolds)
	}
	if n := w.countStatus(t, append(slices.Clone(exports), crawls...), jobs.StatusProcessing); n != 200 {
		t.Fatalf("%d of the 200 stalled jobs PROCESSING after the storm pass, want 200", n)
	}
	if n := w.db.Count(t, `SELECT count(*) FROM job_events WHERE kind = 'reaped'`); n != 0 {
		t.Fatalf("%d reaped events, want 0", n)
	}
	if n := w.a.rc.Exists(ctx, queue.MarkerKey(exports[0]), queue.MarkerKey(crawls[0])).Val(); n != 0 {
		t.Fatal("a held job got a marker")
	}
	if got := metricValue(t, reg1, "jobreaper_stall_storms_total", nil); got != 1 {
		t.Fatalf("jobreaper_stall_storms_total = %v, want 1", got)
	}
	if got := metricValue(t, reg1, "jobreaper_stall_storm_held", nil); got != 200 {
		t.Fatalf("jobreaper_stall_storm_held = %v, want 200", got)
	}
	if got := metricValue(t, reg1, "jobreaper_jobs_skipped_total", map[string]string{"reason": "stall_storm_held"}); got != 200 {
		t.Fatalf("jobreaper_jobs_skipped_total{reason=stall_storm_held} = %v, want 200", got)
	}
	if lines := w.logs.take(); countLines(lines, "level=WARN", "stall storm", "stalled=200", "judged=220",
		"types=\"[crawl.site report.export]\"", qa, qb, "limit=max_stalled_per_pass") != 1 {
		t.Fatalf("want one WARN line with the counts, types and queues of the storm; log:\n%s", strings.Join(lines, "\n"))
	}

	// During the hold: 30 held jobs make progress, 5 running jobs stall.
	w.moved(t, 0, exports[:30])
	w.moved(t, 21*time.Minute, running[:5])
	res, err = runOnce(t, ctx, r1)
	if err != nil || res.Reaped != 0 || res.StallStormHeld != 175 || res.ScannedBy["progressing"] != 45 ||
		len(res.StallStormHolds) != 1 || res.StallStormHolds[0].Started {
		t.Fatalf("pass during the hold = %+v, %v; want 175 held (5 new), 45 progressing, none reaped", res, err)
	}

	// Another queue set sharing qb, with no limits of its own: qb held,
	// qc reaped.
	lone := w.stalled(t, qc, "report.export", "s", 3)
	r2, reg2 := w.reaper(t, []string{qb, qc})
	res, err = runOnce(t, ctx, r2)
	if err != nil || res.Reaped != 3 || res.StallStormHeld != 50 || len(res.StallStormHolds) != 1 ||
		res.StallStormHolds[0].ID != h.ID || !slices.Equal(res.StallStormHolds[0].Queues, []string{qa, qb}) {
		t.Fatalf("replica of %s,%s = %+v, %v; want qb's 50 held by hold %d, qc's 3 reaped", qb, qc, res, err, h.ID)
	}
	if n := w.countStatus(t, lone, jobs.StatusFailed); n != 3 {
		t.Fatalf("%d of qc's stalled jobs FAILED, want 3", n)
	}
	if got := metricValue(t, reg2, "jobreaper_stall_storms_total", nil); got != 0 {
		t.Fatalf("the other replica started %v holds, want 0", got)
	}

	// A Reaper that takes over mid-hold: the hold is a row, it keeps it.
	r3, reg3 := w.reaper(t, []string{qa, qb}, stormLimits)
	res, err = runOnce(t, ctx, r3)
	if err != nil || res.Reaped != 0 || res.StallStormHeld != 175 || len(res.StallStormHolds) != 1 || res.StallStormHolds[0].ID != h.ID {
		t.Fatalf("pass of the new Reaper = %+v, %v; want the 175 held by hold %d", res, err, h.ID)
	}
	if got := metricValue(t, reg3, "jobreaper_stall_storms_total", nil); got != 0 || len(w.holds(t)) != 1 {
		t.Fatalf("the new Reaper started %v holds (%d rows); want none", got, len(w.holds(t)))
	}
	w.logs.take()

	// The hold ends: the first pass reaps every job still stalled, at once.
	w.endHolds(t)
	res, err = runOnce(t, ctx, r1)
	if err != nil || res.Reaped != 175 || res.ReapedBy[jobs.ReasonStalled] != 175 || res.StallStormHeld != 0 ||
		len(res.StallStormHolds) != 0 || res.Errors != 0 {
		t.Fatalf("first pass after the hold = %+v, %v; want 175 reaped in it", res, err)
	}
	if n := w.countStatus(t, exports[:30], jobs.StatusProcessing); n != 30 {
		t.Fatalf("%d of the 30 jobs that made progress during the hold are PROCESSING, want 30", n)
	}
	if n := w.countStatus(t, append(append(slices.Clone(exports[30:]), crawls...), running[:5]...), jobs.StatusFailed); n != 175 {
		t.Fatalf("%d of the 175 jobs still stalled are FAILED, want 175", n)
	}
	if h := w.holds(t)[0]; !slices.Equal(h.Drained, []string{qa, qb}) {
		t.Fatalf("hold after its first pass = %+v, want both queues drained", h)
	}
	if n := w.db.Count(t, `SELECT count(*) FROM reaper_holds WHERE drained_at IS NOT NULL`); n != 1 {
		t.Fatal("the hold's drained_at was not set")
	}
	lines := w.logs.take()
	if countLines(lines, "level=INFO", "stall-storm hold ended") != 1 || countLines(lines, "level=INFO", "stall-storm hold drained", "still_stalled=175") != 1 {
		t.Fatalf("want an INFO line for the end and one for the drain; log:\n%s", strings.Join(lines, "\n"))
	}
	if got := metricValue(t, reg1, "jobreaper_stall_storm_held", nil); got != 0 {
		t.Fatalf("jobreaper_stall_storm_held = %v after the hold, want 0", got)
	}

	// Later passes check those queues again: the next storm is held.
	w.stalled(t, qa, "report.export", "t", 101)
	res, err = runOnce(t, ctx, r1)
	if err != nil || res.Reaped != 0 || res.StallStormHeld != 101 || len(w.holds(t)) != 2 {
		t.Fatalf("next storm = %+v, %v, %d holds; want 101 held by a second hold", res, err, len(w.holds(t)))
	}
	if h := w.holds(t)[1]; !slices.Equal(h.Queues, []string{qa}) || h.Until.Sub(h.StartedAt) != 15*time.Minute {
		t.Fatalf("second hold = %+v, want queue %s for report.export's 15 minutes", h, qa)
	}
}

// 50 active jobs that stall a few at a time, fewer than 10 per pass and
// under half of them, are reaped pass by pass as before the storm check:
// no hold is ever recorded.
func TestStallStorm_JobsStallingOneByOneAreReapedAsBefore(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	w := newStormWorld(t)
	q := w.queue(t, "trickle")
	ids := w.running(t, q, "r", 50)
	r, reg := w.reaper(t, []string{q}, stormLimits)
	reaped := 0
	for start := 0; start < len(ids); start += 9 {
		batch := ids[start:min(start+9, len(ids))]
		w.moved(t, 21*time.Minute, batch)
		res, err := runOnce(t, ctx, r)
		if err != nil || res.Reaped != len(batch) || res.StallStormHeld != 0 || len(res.StallStormHolds) != 0 {
			t.Fatalf("pass after %d more stalled = %+v, %v; want them reaped", len(batch), res, err)
		}
		reaped += res.Reaped
	}
	if reaped != 50 || w.countStatus(t, ids, jobs.StatusFailed) != 50 {
		t.Fatalf("%d reaped, want all 50", reaped)
	}
	if n := len(w.holds(t)); n != 0 {
		t.Fatalf("%d holds recorded, want none", n)
	}
	if got := metricValue(t, reg, "jobreaper_stall_storms_total", nil); got != 0 {
		t.Fatalf("jobreaper_stall_storms_total = %v, want 0", got)
	}
}

// A dry run never starts a hold: on 20 jobs of 20 stalled it says a real
// pass would hold them (a hold with ID 0, each decision a
// stall_storm_held skip) and writes nothing. It honours a hold a real
// pass recorded, and on that hold's end says it would reap them all,
// without recording the end: the real pass after it still reaps them
// without the storm check. stall_storm_hold sets the hold's length.
func TestStallStorm_DryRunNeverStartsAHold(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	w := newStormWorld(t)
	q := w.queue(t, "dry")
	ids := w.stalled(t, q, "report.export", "s", 20)
	dry, regDry := w.reaper(t, []string{q}, stormLimits, func(o *reaper.Options) { o.DryRun = true })

	res, err := runOnce(t, ctx, dry)
	if err != nil || res.Reaped != 0 || res.StallStormHeld != 20 || len(res.StallStormHolds) != 1 ||
		res.StallStormHolds[0].ID != 0 || !res.StallStormHolds[0].Started || res.StallStormHolds[0].Held != 20 {
		t.Fatalf("dry run = %+v, %v; want 20 held by a hold it would start", res, err)
	}
	for _, d := range res.Decisions {
		if d.Decision != reaper.DecisionSkip || d.Reason != "stall_storm_held" {
			t.Fatalf("decision %+v, want skip stall_storm_held", d)
		}
	}
	if len(res.Decisions) != 20 || len(w.holds(t)) != 0 || metricValue(t, regDry, "jobreaper_stall_storms_total", nil) != 0 {
		t.Fatalf("dry run: %d decisions, %d holds recorded; want 20 and none", len(res.Decisions), len(w.holds(t)))
	}
	if lines := w.logs.take(); countLines(lines, "level=WARN", "dry run: a stall storm", "stalled=20") != 1 {
		t.Fatalf("want the dry run's WARN line; log:\n%s", strings.Join(lines, "\n"))
	}

	live, _ := w.reaper(t, []string{q}, stormLimits, func(o *reaper.Options) { o.StallStormHold = 2 * time.Minute })
	if res, err := runOnce(t, ctx, live); err != nil || res.StallStormHeld != 20 || len(w.holds(t)) != 1 {
		t.Fatalf("real pass = %+v, %v; want 20 held by a recorded hold", res, err)
	}
	h := w.holds(t)[0]
	if h.Until.Sub(h.StartedAt) != 2*time.Minute || !strings.Contains(h.Tripped, "max_stalled_fraction 0.5") {
		t.Fatalf("hold = %+v; want 2 minutes (stall_storm_hold), tripped by the fraction", h)
	}
	res, err = runOnce(t, ctx, dry)
	if err != nil || res.StallStormHeld != 20 || len(res.StallStormHolds) != 1 || res.StallStormHolds[0].ID != h.ID || res.StallStormHolds[0].Started {
		t.Fatalf("dry run during the hold = %+v, %v; want the 20 held by hold %d", res, err, h.ID)
	}

	w.endHolds(t)
	res, err = runOnce(t, ctx, dry)
	if err != nil || res.Reaped != 20 || res.StallStormHeld != 0 || len(res.StallStormHolds) != 0 {
		t.Fatalf("dry run after the hold = %+v, %v; want 20 it would reap", res, err)
	}
	if h := w.holds(t)[0]; len(h.Drained) != 0 || w.countStatus(t, ids, jobs.StatusProcessing) != 20 {
		t.Fatalf("the dry run wrote: hold %+v", h)
	}
	if res, err := runOnce(t, ctx, live); err != nil || res.Reaped != 20 {
		t.Fatalf("real pass after the hold = %+v, %v; want the 20 reaped", res, err)
	}
}

// A hold on two queues that two replicas scan apart ends: the first pass
// of each reaps its own queue's stalled jobs without the storm check and
// records only that queue as drained; the first replica's later passes
// check its queue again (a new storm there is held anew) while the other
// replica's first pass after the end is still to come, and it still reaps
// at once. Neither logs the end again once its queue is drained.
func TestStallStorm_EachQueueSetDrainsItsOwnQueues(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	w := newStormWorld(t)
	qa, qb := w.queue(t, "split-a"), w.queue(t, "split-b")
	w.stalled(t, qa, "report.export", "s", 60)
	w.stalled(t, qb, "report.export", "s", 60)
	both, _ := w.reaper(t, []string{qa, qb}, stormLimits)
	if res, err := runOnce(t, ctx, both); err != nil || res.StallStormHeld != 120 || len(w.holds(t)) != 1 {
		t.Fatalf("storm pass = %+v, %v; want 120 held by one hold", res, err)
	}
	w.endHolds(t)
	ra, _ := w.reaper(t, []string{qa}, stormLimits)
	rb, _ := w.reaper(t, []string{qb}, stormLimits)
	w.logs.take()
	if res, err := runOnce(t, ctx, ra); err != nil || res.Reaped != 60 {
		t.Fatalf("replica of %s after the hold = %+v, %v; want its 60 reaped at once", qa, res, err)
	}
	if h := w.holds(t)[0]; !slices.Equal(h.Drained, []string{qa}) {
		t.Fatalf("hold = %+v; want only %s drained", h, qa)
	}
	// qa is checked again: 101 stalled is a new storm there.
	w.stalled(t, qa, "report.export", "t", 101)
	res, err := runOnce(t, ctx, ra)
	if err != nil || res.Reaped != 0 || res.StallStormHeld != 101 || len(w.holds(t)) != 2 {
		t.Fatalf("replica of %s, next storm = %+v, %v; want the 101 held by a second hold", qa, res, err)
	}
	if lines := w.logs.take(); countLines(lines, "stall-storm hold ended") != 1 {
		t.Fatalf("want the end logged once by the replica of %s; log:\n%s", qa, strings.Join(lines, "\n"))
	}
	if res, err := runOnce(t, ctx, rb); err != nil || res.Reaped != 60 || res.StallStormHeld != 0 {
		t.Fatalf("replica of %s after the hold = %+v, %v; want its 60 reaped at once", qb, res, err)
	}
	if n := w.db.Count(t, `SELECT count(*) FROM reaper_holds WHERE id = $1 AND drained_at IS NOT NULL`, w.holds(t)[0].ID); n != 1 {
		t.Fatal("the first hold is not drained once both queues were")
	}
}

// Retry reaps count like reaps in the storm check: 20 stalled jobs of a
// type with reap_retries = 1, all of the active tasks judged, are held,
// not retried; the hold records them all and none is put back to QUEUED.
func TestStallStorm_RetryReapsCountLikeReaps(t *testing.T) {
	t.Parallel()
	w := newStormWorld(t)
	w.db.Exec(t, `UPDATE job_types SET reap_retries = 1 WHERE name = 'report.export'`)
	q := w.queue(t, "retrystorm")
	ids := w.stalled(t, q, "report.export", "s", 20)
	r, _ := w.reaper(t, []string{q}, stormLimits)
	res, err := runOnce(t, t.Context(), r)
	if err != nil || res.Reaped != 0 || res.RetriedBy[jobs.ReasonStalled] != 0 || res.StallStormHeld != 20 {
		t.Fatalf("pass = %+v, %v; want the 20 retry reaps held as a storm", res, err)
	}
	if n := w.countStatus(t, ids, jobs.StatusProcessing); n != 20 {
		t.Fatalf("%d of 20 still PROCESSING, want all", n)
	}
}
