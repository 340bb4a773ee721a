package jobs_test

import (
	"context"
	"encoding/json"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
)

// statements records the SQL of every statement a pool sends (a pgx
// tracer), so a test counts round trips instead of trusting the code
// under test.
type statements struct {
	mu   sync.Mutex
	sqls []string
}

func (s *statements) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sqls = append(s.sqls, data.SQL)
	return ctx
}

func (*statements) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// take returns the statements sent since the last take.
func (s *statements) take() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := s.sqls
	s.sqls = nil
	return out
}

// tracedStore returns a Store over a pool of its own on db's schema whose
// statements are recorded.
func tracedStore(t *testing.T, db *jobstest.DB, opts ...jobs.StoreOption) (*jobs.Store, *statements) {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	rec := &statements{}
	cfg.ConnConfig.Tracer = rec
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return jobs.NewStore(pool, append([]jobs.StoreOption{jobs.WithSchema(db.Schema)}, opts...)...), rec
}

// idleGap returns job id's max_idle_gap in seconds, -1 when NULL.
func idleGap(t *testing.T, db *jobstest.DB, id string) float64 {
	t.Helper()
	var s float64
	err := db.Pool.QueryRow(context.Background(),
		`SELECT coalesce(extract(epoch FROM max_idle_gap)::float8, -1) FROM `+db.Table("jobs")+` WHERE id = $1`, id).Scan(&s)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// setIdle moves job id's updated_at to ago before now(), as if its last
// recorded write had been that long ago, without touching anything else.
func setIdle(t *testing.T, db *jobstest.DB, id string, ago time.Duration) {
	t.Helper()
	db.Exec(t, `UPDATE jobs SET updated_at = now() - make_interval(secs => $2) WHERE id = $1`, id, ago.Seconds())
}

// requireNear fails unless got is within [want, want+slack] seconds: a
// gap measured on the database clock a moment after the test set it.
func requireNear(t *testing.T, what string, got, want float64) {
	t.Helper()
	const slack = 30
	if got < want || got > want+slack {
		t.Fatalf("%s = %.3f s, want %.0f s (up to %d s more)", what, got, want, slack)
	}
}

// eventDetail returns the detail of job id's last event of kind.
func eventDetail(t *testing.T, db *jobstest.DB, id, kind string) map[string]any {
	t.Helper()
	var raw []byte
	err := db.Pool.QueryRow(context.Background(),
		`SELECT detail FROM `+db.Table("job_events")+` WHERE job_id = $1 AND kind = $2 ORDER BY id DESC LIMIT 1`, id, kind).Scan(&raw)
	if err != nil {
		t.Fatalf("reading the %s event of %s: %v", kind, id, err)
	}
	var d map[string]any
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatalf("detail %s: %v", raw, err)
	}
	return d
}

// number returns detail's key as a JSON number, failing when it is
// missing or not a number.
func number(t *testing.T, detail map[string]any, key string) float64 {
	t.Helper()
	v, ok := detail[key].(float64)
	if !ok {
		t.Fatalf("detail %v: %s is %T, want a JSON number", detail, key, detail[key])
	}
	return v
}

// The heartbeat keeps the attempt's longest gap between recorded writes in
// its one UPDATE: across many beats the largest gap stays, a shorter one
// never lowers it, each sent heartbeat is one statement and one write, and
// the next claim (here a takeover of the PROCESSING row) resets it and
// records the superseded attempt in its claimed event.
func TestHeartbeatKeepsTheLongestIdleGapInItsOneUpdate(t *testing.T) {
	t.Parallel()
	db := jobstest.New(t)
	baselineTypes(t, db)
	countWrites(t, db)
	store, rec := tracedStore(t, db)
	id := "J-gap"
	db.Insert(t, jobstest.Job{ID: id, Type: "crawl.site", Status: jobs.StatusQueued})
	lease := claim(t, store, id, 0, "W1")
	if got := idleGap(t, db, id); got != 0 {
		t.Fatalf("max_idle_gap after the claim = %v s, want 0", got)
	}
	hb, clock := heartbeater(t, store)
	rec.take()

	// Gaps in minutes before each beat; the longest (12) comes in the
	// middle, shorter ones after it must not lower it.
	gaps := []float64{3, 7, 2, 12, 4, 1, 9, 5}
	longest := 0.0
	for i, g := range gaps {
		setIdle(t, db, id, time.Duration(g*float64(time.Minute)))
		clock.Advance(jobs.HeartbeatIntervalDefault)
		res, err := hb.Heartbeat(context.Background(), lease, int64(i+1))
		if err != nil || !res.Written {
			t.Fatalf("beat %d: %+v, %v", i+1, res, err)
		}
		sent := rec.take()
		if len(sent) != 1 || !strings.Contains(sent[0], "UPDATE") {
			t.Fatalf("beat %d sent %d statements %q, want the one heartbeat UPDATE", i+1, len(sent), sent)
		}
		longest = math.Max(longest, g*60)
		requireNear(t, "max_idle_gap after beat", idleGap(t, db, id), longest)
	}
	if n := writes(t, db, id); n != int64(len(gaps)) {
		t.Fatalf("%d heartbeat writes, want %d (one per beat)", n, len(gaps))
	}
	// A throttled call sends nothing and keeps the gap.
	if res, err := hb.Heartbeat(context.Background(), lease, 100); err != nil || !res.Throttled {
		t.Fatalf("a beat within the interval = %+v, %v; want throttled", res, err)
	}
	if sent := rec.take(); len(sent) != 0 {
		t.Fatalf("a throttled beat sent %q", sent)
	}

	// asynq runs the task again while the row is PROCESSING: the claim
	// takes the row over, resets the gap and records the old attempt.
	backdate(t, db, id, 50*time.Minute, 6*time.Minute)
	next := claim(t, store, id, lease.Generation, "W2")
	if got := idleGap(t, db, id); got != 0 {
		t.Fatalf("max_idle_gap after the takeover = %v s, want 0", got)
	}
	d := eventDetail(t, db, id, "claimed")
	if number(t, d, "previous_generation") != float64(lease.Generation) || d["previous_worker"] != "W1" {
		t.Fatalf("claimed event detail = %v, want the superseded attempt generation %d, worker W1", d, lease.Generation)
	}
	requireNear(t, "previous_runtime_seconds", number(t, d, "previous_runtime_seconds"), 50*60)
	requireNear(t, "previous_idle_seconds", number(t, d, "previous_idle_seconds"), 6*60)
	requireNear(t, "previous_max_idle_gap_seconds", number(t, d, "previous_max_idle_gap_seconds"), 12*60)

	// The new attempt keeps its own gaps from 0.
	setIdle(t, db, id, 2*time.Minute)
	clock.Advance(jobs.HeartbeatIntervalDefault)
	if res, err := hb.Heartbeat(context.Background(), next, 1); err != nil || !res.Written {
		t.Fatalf("first beat of the new attempt: %+v, %v", res, err)
	}
	requireNear(t, "max_idle_gap of the new attempt", idleGap(t, db, id), 2*60)

	// A claim of a QUEUED row records no previous attempt.
	fresh := "J-gap-queued"
	db.Insert(t, jobstest.Job{ID: fresh, Type: "crawl.site", Status: jobs.StatusQueued})
	claim(t, store, fresh, 0, "W1")
	if d := eventDetail(t, db, fresh, "claimed"); len(d) != 0 {
		t.Fatalf("claimed event of a QUEUED row = %v, want {}", d)
	}
}

// The start guard's admission claims as Claim does: it resets the gap and
// records the attempt it takes over.
func TestAdmitTakeoverRecordsThePreviousAttempt(t *testing.T) {
	t.Parallel()
	db, store := setup(t, nil)
	id := "J-admit-gap"
	db.Insert(t, jobstest.Job{ID: id, Type: "report.export", Generation: 3, Worker: "W-old",
		StartedAgo: jobstest.Ago(20 * time.Minute), IdleAgo: 8 * time.Minute})
	db.Exec(t, `UPDATE jobs SET max_idle_gap = interval '11 minutes' WHERE id = $1`, id)
	adm, err := store.Admit(context.Background(), jobs.AdmitRequest{JobID: id, Worker: "W-new", Claim: true})
	if err != nil || adm.Outcome != jobs.AdmitClaimed {
		t.Fatalf("Admit = %+v, %v; want a claim", adm, err)
	}
	if got := idleGap(t, db, id); got != 0 {
		t.Fatalf("max_idle_gap after the admission = %v s, want 0", got)
	}
	d := eventDetail(t, db, id, "claimed")
	if number(t, d, "previous_generation") != 3 || d["previous_worker"] != "W-old" {
		t.Fatalf("claimed event detail = %v", d)
	}
	requireNear(t, "previous_runtime_seconds", number(t, d, "previous_runtime_seconds"), 20*60)
	requireNear(t, "previous_idle_seconds", number(t, d, "previous_idle_seconds"), 8*60)
	// The stored 11 minutes beat the 8 idle at the takeover.
	requireNear(t, "previous_max_idle_gap_seconds", number(t, d, "previous_max_idle_gap_seconds"), 11*60)
}

// Advance keeps the gap in the UPDATE that moves the cursor.
func TestAdvanceKeepsTheLongestIdleGap(t *testing.T) {
	t.Parallel()
	db, store := setup(t, nil)
	id := "J-adv-gap"
	lease := queued(t, db, store, jobstest.Job{ID: id, Type: "crawl.site", Total: ptr[int64](100)}, "W1")
	for i, g := range []time.Duration{4 * time.Minute, 9 * time.Minute, time.Minute} {
		setIdle(t, db, id, g)
		err := inTx(t, db, func(tx pgx.Tx) error {
			_, err := store.Advance(context.Background(), tx, lease, "b"+string(rune('0'+i)), int64(i*10), 10)
			return err
		})
		requireNoErr(t, err)
	}
	requireNear(t, "max_idle_gap after three batches", idleGap(t, db, id), 9*60)
}

// The completed and failed events carry the attempt's runtime and longest
// gap (the gap up to the final write included), as JSON numbers; the
// worker library observes the runtimes in jobreaper_job_runtime_seconds.
func TestFinalEventsCarryRuntimeAndIdleGap(t *testing.T) {
	t.Parallel()
	db := jobstest.New(t)
	baselineTypes(t, db)
	db.Exec(t, `INSERT INTO job_types (name, max_runtime, auto_complete) VALUES ('auto.done', '30 minutes', true)`)
	reg := prometheus.NewRegistry()
	store := db.Store(jobs.WithRegisterer(reg))
	ctx := context.Background()

	start := func(id, typ string, started, idle, gap time.Duration) jobs.Lease {
		t.Helper()
		lease := queued(t, db, store, jobstest.Job{ID: id, Type: typ}, "W1")
		backdate(t, db, id, started, idle)
		db.Exec(t, `UPDATE jobs SET max_idle_gap = make_interval(secs => $2) WHERE id = $1`, id, gap.Seconds())
		return lease
	}
	// Complete: the last gap (7 min) beats the kept one (4 min).
	c := start("J-complete", "report.export", 40*time.Minute, 7*time.Minute, 4*time.Minute)
	requireNoErr(t, inTx(t, db, func(tx pgx.Tx) error { _, err := store.Complete(ctx, tx, c); return err }))
	d := eventDetail(t, db, "J-complete", "completed")
	requireNear(t, "completed runtime_seconds", number(t, d, "runtime_seconds"), 40*60)
	requireNear(t, "completed max_idle_gap_seconds", number(t, d, "max_idle_gap_seconds"), 7*60)
	requireNear(t, "J-complete's max_idle_gap", idleGap(t, db, "J-complete"), 7*60)

	// CompleteWith: the kept gap (13 min) beats the last one (1 min).
	cw := start("J-completewith", "crawl.site", 90*time.Minute, time.Minute, 13*time.Minute)
	if _, err := store.CompleteWith(ctx, nil, cw, nil); err != nil {
		t.Fatal(err)
	}
	d = eventDetail(t, db, "J-completewith", "completed")
	requireNear(t, "CompleteWith runtime_seconds", number(t, d, "runtime_seconds"), 90*60)
	requireNear(t, "CompleteWith max_idle_gap_seconds", number(t, d, "max_idle_gap_seconds"), 13*60)

	// Fail keeps its code next to them.
	f := start("J-fail", "crawl.site", 10*time.Minute, 3*time.Minute, 2*time.Minute)
	requireNoErr(t, store.Fail(ctx, f, "upstream_timeout"))
	d = eventDetail(t, db, "J-fail", "failed")
	if d["code"] != "upstream_timeout" {
		t.Fatalf("failed event detail = %v", d)
	}
	requireNear(t, "failed runtime_seconds", number(t, d, "runtime_seconds"), 10*60)
	requireNear(t, "failed max_idle_gap_seconds", number(t, d, "max_idle_gap_seconds"), 3*60)

	// AutoComplete likewise, with its flag.
	a := start("J-auto", "auto.done", 5*time.Minute, 2*time.Minute, 0)
	if res, err := store.AutoComplete(ctx, a); err != nil || !res.Confirmed {
		t.Fatalf("AutoComplete = %+v, %v", res, err)
	}
	d = eventDetail(t, db, "J-auto", "completed")
	if d["auto_complete"] != true {
		t.Fatalf("auto-completed event detail = %v", d)
	}
	requireNear(t, "auto-completed runtime_seconds", number(t, d, "runtime_seconds"), 5*60)

	// A replayed completion observes nothing again.
	if res, err := store.CompleteWith(ctx, nil, cw, nil); err != nil || !res.Replayed {
		t.Fatalf("replayed CompleteWith = %+v, %v", res, err)
	}

	// The histogram holds exactly these attempts, each in its series.
	for _, want := range []struct {
		typ, outcome string
		count        uint64
		sum          float64
	}{
		{"report.export", "completed", 1, 40 * 60},
		{"crawl.site", "completed", 1, 90 * 60},
		{"crawl.site", "failed", 1, 10 * 60},
		{"auto.done", "completed", 1, 5 * 60},
	} {
		h := runtimeHistogram(t, reg, want.typ, want.outcome)
		if h == nil || h.GetSampleCount() != want.count {
			t.Fatalf("jobreaper_job_runtime_seconds{type=%q,outcome=%q} = %v, want %d sample(s)", want.typ, want.outcome, h, want.count)
		}
		requireNear(t, "runtime sum of "+want.typ+"/"+want.outcome, h.GetSampleSum(), want.sum)
	}
	if h := runtimeHistogram(t, reg, "report.export", "failed"); h != nil {
		t.Fatalf("a series nobody observed exists: %v", h)
	}
}

// runtimeHistogram returns the jobreaper_job_runtime_seconds series of
// typ and outcome gathered from reg, nil when it does not exist.
func runtimeHistogram(t *testing.T, reg *prometheus.Registry, typ, outcome string) *dto.Histogram {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != "jobreaper_job_runtime_seconds" {
			continue
		}
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["type"] == typ && labels["outcome"] == outcome {
				return m.GetHistogram()
			}
		}
	}
	return nil
}

// The reaped event carries the attempt's longest gap, the idle time up to
// the reap included, next to its runtime.
func TestReapedEventCarriesTheIdleGap(t *testing.T) {
	t.Parallel()
	db, store := setup(t, nil)
	id := "J-reaped-gap"
	queued(t, db, store, jobstest.Job{ID: id, Type: "report.export"}, "W1")
	backdate(t, db, id, 45*time.Minute, 20*time.Minute)
	if !reap(t, store, id) {
		t.Fatal("the stalled job was not reaped")
	}
	d := eventDetail(t, db, id, "reaped")
	requireNear(t, "reaped runtime_seconds", number(t, d, "runtime_seconds"), 45*60)
	requireNear(t, "reaped max_idle_gap_seconds", number(t, d, "max_idle_gap_seconds"), 20*60)

	// A longer gap kept earlier in the attempt wins over the final idle.
	other := "J-reaped-kept"
	queued(t, db, store, jobstest.Job{ID: other, Type: "report.export"}, "W1")
	backdate(t, db, other, 60*time.Minute, 16*time.Minute)
	db.Exec(t, `UPDATE jobs SET max_idle_gap = interval '25 minutes' WHERE id = $1`, other)
	if !reap(t, store, other) {
		t.Fatal("the second stalled job was not reaped")
	}
	requireNear(t, "reaped max_idle_gap_seconds", number(t, eventDetail(t, db, other, "reaped"), "max_idle_gap_seconds"), 25*60)
}
