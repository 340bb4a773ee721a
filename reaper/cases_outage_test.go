package reaper_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/jobreaper/jobreaper/internal/asynqstate"
	"github.com/jobreaper/jobreaper/internal/pgstore"
	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
	"github.com/jobreaper/jobreaper/queue"
	"github.com/jobreaper/jobreaper/reaper"
)

// B47's limits, ten times the margins of the case's 5 s: a stall timeout
// of 10 s, a heartbeat limiter of 2 s and passes every second (the
// smallest sane stall timeout is then 2 x 2 s + 1 s = 5 s), handlers that
// call Heartbeat every 200 ms, and a max_runtime of 1 s, so that every job
// is past it from the start.
const (
	outageStall     = 10 * time.Second
	outageHeartbeat = 2 * time.Second
	outageInterval  = time.Second
	outageTick      = 200 * time.Millisecond
	// outageLength is the case's outage: the stall timeout plus one
	// heartbeat interval, so that every live job looks stalled when
	// PostgreSQL comes back.
	outageLength = outageStall + outageHeartbeat
)

var outageRule = pgstore.StallRule{DefaultStallTimeout: outageStall, MinStallTimeout: 2*outageHeartbeat + outageInterval,
	DefaultHardTimeout: jobs.HardTimeoutDefault}

// outageWorkers are asynq workers on the real Redis whose handlers, run
// through the real start guard, heartbeat every outageTick with a growing
// mark through a Heartbeater of outageHeartbeat, over a pool the test may
// cut, until the test ends; a job named in hang stops heartbeating (a
// handler stuck in a call) but keeps running.
type outageWorkers struct {
	a     *realAsynq
	q     string
	hb    *jobs.Heartbeater
	done  chan struct{}
	hangs sync.Map // job ID -> struct{}
}

// startOutageWorkers runs the workers on store (the workers' own pool).
func startOutageWorkers(t *testing.T, a *realAsynq, q string, store *jobs.Store, markers queue.MarkerReader, concurrency int) *outageWorkers {
	t.Helper()
	hb, err := jobs.NewHeartbeater(store, nil, outageHeartbeat)
	if err != nil {
		t.Fatal(err)
	}
	w := &outageWorkers{a: a, q: q, hb: hb, done: make(chan struct{})}
	mux := asynq.NewServeMux()
	mux.Use(queue.NewGuard(store, markers, queue.WithWorker("W47"), queue.WithLogger(testLogger(t))).Middleware())
	mux.HandleFunc("b47.work", w.handle)
	srv := asynq.NewServerFromRedisClient(a.rc, asynq.Config{Queues: map[string]int{q: 1}, Concurrency: concurrency,
		LogLevel: asynq.FatalLevel, IsFailure: queue.IsFailure, ShutdownTimeout: 5 * time.Second})
	if err := srv.Start(mux); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		close(w.done) // the handlers return first, so the shutdown waits for nothing
		srv.Shutdown()
		_ = a.insp.DeleteQueue(q, true)
	})
	return w
}

func (w *outageWorkers) handle(ctx context.Context, _ *asynq.Task) error {
	lease, err := jobs.LeaseFromContext(ctx)
	if err != nil {
		return err
	}
	tick := time.NewTicker(outageTick)
	defer tick.Stop()
	for mark := int64(1); ; mark++ {
		if _, hung := w.hangs.Load(lease.JobID); !hung {
			// A failed write (PostgreSQL unreachable) is retried by the
			// Heartbeater's backoff; the handler just goes on.
			_, _ = w.hb.Heartbeat(ctx, lease, mark)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-w.done:
			return fmt.Errorf("the test ended")
		case <-tick.C:
		}
	}
}

// enqueue inserts a QUEUED row per ID and enqueues its task with the
// enqueue helper.
func (w *outageWorkers) enqueue(t *testing.T, d outageDB, ids []string) {
	t.Helper()
	for _, id := range ids {
		if _, err := d.pool.Exec(t.Context(), `INSERT INTO `+d.table("jobs")+` (id, type, status, queue) VALUES ($1, 'b47.work', 'QUEUED', $2)`,
			id, w.q); err != nil {
			t.Fatal(err)
		}
		if _, err := queue.Enqueue(t.Context(), w.a.client, d.store(), asynq.NewTask("b47.work", nil), id); err != nil {
			t.Fatalf("enqueueing %s: %v", id, err)
		}
	}
}

// passLoop runs a daemon's passes (RunOnce every outageInterval) until the
// test ends, and keeps their results.
type passLoop struct {
	mu     sync.Mutex
	passes []passRecord
	cancel context.CancelFunc
	ended  chan struct{}
}

type passRecord struct {
	at  time.Time // when the pass began
	res reaper.Result
	err error
}

func startPassLoop(t *testing.T, r *reaper.Reaper) *passLoop {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	l := &passLoop{cancel: cancel, ended: make(chan struct{})}
	go func() {
		defer close(l.ended)
		for ctx.Err() == nil {
			began := time.Now()
			res, err := r.RunOnce(ctx)
			l.mu.Lock()
			l.passes = append(l.passes, passRecord{at: began, res: res, err: err})
			l.mu.Unlock()
			select {
			case <-ctx.Done():
			case <-time.After(outageInterval):
			}
		}
	}()
	t.Cleanup(l.stop)
	return l
}

// stop ends the loop and waits for its last pass.
func (l *passLoop) stop() {
	l.cancel()
	<-l.ended
}

// since returns the passes that began after from and ran (no error).
func (l *passLoop) since(from time.Time) []reaper.Result {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []reaper.Result
	for _, p := range l.passes {
		if p.at.After(from) && p.err == nil {
			out = append(out, p.res)
		}
	}
	return out
}

// waitPasses waits until n good passes began after from.
func (l *passLoop) waitPasses(t *testing.T, from time.Time, n int) []reaper.Result {
	t.Helper()
	waitFor(t, 60*time.Second, fmt.Sprintf("%d good passes", n), func() bool { return len(l.since(from)) >= n })
	return l.since(from)
}

// waitFor polls cond every 50 ms until it holds, failing after timeout.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting until %s", timeout, what)
		}
		time.Sleep(50 * time.Millisecond) // polling
	}
}

// outageDB is the test's view of a schema, through a pool the test never
// cuts (the shared test server's, or the test's own cluster's).
type outageDB struct {
	pool   *pgxpool.Pool
	schema string
}

func (d outageDB) table(name string) string { return pgx.Identifier{d.schema, name}.Sanitize() }

func (d outageDB) store() *pgstore.Store { return pgstore.New(d.pool, pgstore.WithSchema(d.schema)) }

// now reads the database clock.
func (d outageDB) now(t *testing.T) time.Time {
	t.Helper()
	var now time.Time
	if err := d.pool.QueryRow(t.Context(), `SELECT now()`).Scan(&now); err != nil {
		t.Fatal(err)
	}
	return now
}

// count counts the jobs of ids matching cond (SQL over jobs j; args from
// $2).
func (d outageDB) count(t *testing.T, cond string, ids []string, args ...any) int {
	t.Helper()
	var n int
	if err := d.pool.QueryRow(t.Context(), `SELECT count(*) FROM `+d.table("jobs")+` j WHERE j.id = ANY($1) AND `+cond,
		append([]any{ids}, args...)...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// outage reads the outage row.
func (d outageDB) outage(t *testing.T) (end time.Time, cause string) {
	t.Helper()
	if err := d.pool.QueryRow(t.Context(), `SELECT outage_end, cause FROM `+d.table("reaper_outages")).Scan(&end, &cause); err != nil {
		t.Fatal(err)
	}
	return end, cause
}

// evidence reads the evidence of job id's reaped event.
func (d outageDB) evidence(t *testing.T, id string) pgstore.Evidence {
	t.Helper()
	var ev pgstore.Evidence
	if err := d.pool.QueryRow(t.Context(), `SELECT detail FROM `+d.table("job_events")+` WHERE job_id = $1 AND kind = 'reaped'`, id).
		Scan(&ev); err != nil {
		t.Fatalf("reading the reaped event of %s: %v", id, err)
	}
	return ev
}

// requireNoneReaped fails when a job of ids is not PROCESSING.
func (d outageDB) requireNoneReaped(t *testing.T, ids []string) {
	t.Helper()
	rows, err := d.pool.Query(t.Context(), `SELECT id || ' ' || status || ' ' || coalesce(failure_reason, '') FROM `+d.table("jobs")+
		` WHERE id = ANY($1) AND status <> 'PROCESSING' ORDER BY id`, ids)
	if err != nil {
		t.Fatal(err)
	}
	changed, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if len(changed) > 0 {
		t.Fatalf("%d of %d live jobs were reaped or changed: %v", len(changed), len(ids), changed)
	}
}

// sharedOutage is B47 in one process: live heartbeating jobs past
// max_runtime (and, with hung, one whose handler stopped heartbeating
// before the outage), a daemon and the workers each on a pool of their
// own, both pools cut for outageLength, then restored in the worst order:
// the daemon's first, and the workers' once the daemon's first pass after
// the outage has run, so that this pass sees every job idle for longer
// than the stall timeout, before any heartbeat could land.
type sharedOutage struct {
	db              *jobstest.DB
	admin           outageDB
	live            []string
	hung            string
	loop            *passLoop
	reg             *prometheus.Registry
	cutAt, restored time.Time // database clock
	restoredLocal   time.Time
	// firstPass is the daemon's first good pass after the outage.
	firstPass reaper.Result
}

func runSharedOutage(t *testing.T, nLive int, withHung bool) *sharedOutage {
	t.Helper()
	o := &sharedOutage{db: jobstest.New(t)}
	o.admin = outageDB{o.db.Pool, o.db.Schema}
	o.db.JobType(t, "b47.work", "1 second", "", "")
	a := newRealAsynq(t)
	q := "b47-" + a.suffix
	markers := newMarkers(t, a.rc)
	o.live = idsOf("J47-"+a.suffix, nLive)
	ids := o.live
	if withHung {
		o.hung = "J47-hung-" + a.suffix
		ids = append(append([]string{}, o.live...), o.hung)
	}
	t.Cleanup(func() {
		for _, id := range ids {
			a.rc.Del(context.Background(), queue.MarkerKey(id))
		}
	})

	// The workers' pool and the daemon's, each cut on its own.
	workerCut := o.db.Cuttable(t)
	workerStore := jobs.NewStore(workerCut.Pool, jobs.WithSchema(o.db.Schema), jobs.WithOpTimeout(2*time.Second))
	watch := pgstore.NewConnWatch(2 * time.Second)
	daemonCut := o.db.Cuttable(t, watch.Install)
	daemonStore := pgstore.New(daemonCut.Pool, pgstore.WithSchema(o.db.Schema), pgstore.WithOpTimeout(2*time.Second), pgstore.WithConnWatch(watch))

	w := startOutageWorkers(t, a, q, workerStore, markers, len(ids)+2)
	w.enqueue(t, o.admin, ids)
	waitFor(t, 60*time.Second, "every job is claimed, heartbeating and past max_runtime", func() bool {
		return o.admin.count(t, `j.status = 'PROCESSING' AND j.progress_mark > 0 AND j.started_at < now() - interval '1 second'`, ids) == len(ids)
	})

	lister, err := asynqstate.NewIDLister(a.rc)
	if err != nil {
		t.Fatal(err)
	}
	o.reg = prometheus.NewRegistry()
	r := reaper.New(daemonStore, lister, markers, reaper.Options{Queues: []string{q}, Interval: outageInterval, Rule: outageRule,
		OutageGrace: true, Logger: testLogger(t), Metrics: reaper.NewMetrics(o.reg), Asynq: asynqstate.NewStatusReader(a.rc, 0)})
	start := time.Now()
	o.loop = startPassLoop(t, r)
	for _, res := range o.loop.waitPasses(t, start, 2) {
		if res.Reaped != 0 {
			t.Fatalf("a pass before the outage reaped %d live jobs: %+v", res.Reaped, res)
		}
	}

	if withHung {
		// Its handler stops heartbeating before the outage: it is really
		// stalled, whatever PostgreSQL does.
		w.hangs.Store(o.hung, struct{}{})
	}
	o.cutAt = o.admin.now(t)
	workerCut.Cut()
	daemonCut.Cut()
	time.Sleep(outageLength) // the outage itself, not a wait for an effect
	o.restored = o.admin.now(t)
	o.restoredLocal = time.Now()
	daemonCut.Restore()
	o.firstPass = o.loop.waitPasses(t, o.restoredLocal, 1)[0]
	workerCut.Restore()
	t.Logf("PostgreSQL cut for workers and daemon from %s to %s; the daemon's first pass after it reaped %d, skipped %v",
		o.cutAt.Format(time.StampMicro), o.restored.Format(time.StampMicro), o.firstPass.Reaped, o.firstPass.Skipped)
	if o.firstPass.Reaped != 0 || o.firstPass.Skipped[string(reaper.SkipOutageGrace)] != len(ids) {
		t.Fatalf("the daemon's first pass after the outage reaped %d and held %d as outage_grace; want every one of the %d jobs held",
			o.firstPass.Reaped, o.firstPass.Skipped[string(reaper.SkipOutageGrace)], len(ids))
	}
	return o
}

// waitGraceOver waits until every live job heartbeated after the outage
// and the grace (one stall timeout after the outage end) is over, with two
// more passes after that.
func (o *sharedOutage) waitGraceOver(t *testing.T, end time.Time) {
	t.Helper()
	waitFor(t, 60*time.Second, "every live job's heartbeat lands after the outage", func() bool {
		return o.admin.count(t, `j.updated_at > $2`, o.live, o.restored) == len(o.live)
	})
	waitFor(t, 60*time.Second, "the grace is over", func() bool { return o.admin.now(t).After(end.Add(outageStall)) })
	o.loop.waitPasses(t, time.Now(), 2)
}

// TestCase_B47_ASharedOutageReapsNoLiveJob: 20 live jobs past max_runtime,
// heartbeating every 200 ms, and one whose handler stopped heartbeating
// before the outage; PostgreSQL is unreachable for workers and daemon
// alike for the stall timeout plus one heartbeat interval (12 s of 10 s),
// then back, the daemon first. The daemon's first good pass records the
// outage's end and holds all 21 as outage_grace; none of the 20 is ever
// reaped (their heartbeats land within the grace); the stalled one is held
// too, then reaped once the grace is over, its reaped event naming the
// outage end, at least one stall timeout after it.
func TestCase_B47_ASharedOutageReapsNoLiveJob(t *testing.T) {
	o := runSharedOutage(t, 20, true)
	waitFor(t, 60*time.Second, "the stalled job is reaped after the grace", func() bool {
		return o.admin.count(t, `j.status = 'FAILED' AND j.failure_reason = 'stalled'`, []string{o.hung}) == 1
	})
	end, cause := o.admin.outage(t)
	if cause != "connection_lost" || !end.After(o.restored) {
		t.Fatalf("recorded outage end %s (%s), want connection_lost after PostgreSQL came back at %s", end, cause, o.restored)
	}
	ev := o.admin.evidence(t, o.hung)
	if ev.OutageEnd == nil || !ev.OutageEnd.Equal(end) || ev.DBNow.Sub(end) < outageStall {
		t.Fatalf("the stalled job's evidence: outage end %v, reaped at %s; want the outage end %s and a reap a stall timeout after it",
			ev.OutageEnd, ev.DBNow, end)
	}
	o.waitGraceOver(t, end)
	o.loop.stop()
	passes := o.loop.since(o.restoredLocal)
	o.admin.requireNoneReaped(t, o.live)
	held, reaped := 0, 0
	for _, res := range passes {
		held += res.Skipped[string(reaper.SkipOutageGrace)]
		reaped += res.Reaped
	}
	if held == 0 || reaped != 1 {
		t.Fatalf("passes since PostgreSQL came back held %d jobs as outage_grace and reaped %d; want some held and only the stalled one reaped", held, reaped)
	}
	if v := metricValue(t, o.reg, "jobreaper_jobs_skipped_total", map[string]string{"reason": "outage_grace"}); v != float64(held) {
		t.Fatalf("jobreaper_jobs_skipped_total{reason=\"outage_grace\"} = %v, want %d", v, held)
	}
	t.Logf("%d passes since PostgreSQL came back held %d jobs as outage_grace", len(passes), held)
}

// TestCase_B47_ASharedOutageWithFiveLiveJobs: the same outage with 5 live
// jobs, too few for any mass-stall guard to notice: the outage grace alone
// keeps every one of them (the daemon's first pass after the outage holds
// all 5).
func TestCase_B47_ASharedOutageWithFiveLiveJobs(t *testing.T) {
	o := runSharedOutage(t, 5, false)
	var end time.Time
	waitFor(t, 60*time.Second, "the daemon records the outage's end", func() bool {
		var cause string
		end, cause = o.admin.outage(t)
		return cause == "connection_lost"
	})
	o.waitGraceOver(t, end)
	o.admin.requireNoneReaped(t, o.live)
}

// TestCase_B47_AStatementThatFailsEveryPassIsNoOutage: an on_failed
// cascade that fails for one job on every pass, with a serialization
// failure (an error the finalization retries count as transient) and
// division by zero, is a server's answer, not a lost connection: it
// records no outage end, and the other stalled jobs are reaped at once,
// pass after pass.
func TestCase_B47_AStatementThatFailsEveryPassIsNoOutage(t *testing.T) {
	ctx := t.Context()
	db := jobstest.New(t)
	db.JobType(t, "report.export", "30 minutes", "", "")
	db.Exec(t, `CREATE FUNCTION fail_for(id text) RETURNS int LANGUAGE plpgsql AS $$
BEGIN
    IF id LIKE 'broken-serial%' THEN RAISE EXCEPTION 'the cascade fails for %', id USING ERRCODE = '40001'; END IF;
    IF id LIKE 'broken-zero%' THEN RETURN 1 / 0; END IF;
    RETURN 1;
END $$`)
	// An outage end long before the jobs' last progress, as the first
	// pass after migrate on a server up for a day would have recorded.
	db.Exec(t, `INSERT INTO reaper_outages (database, outage_end, cause, timeline, postmaster_start, recorded_by, recorded_at)
SELECT current_database(), now() - interval '1 day', 'first_record', (SELECT timeline_id FROM pg_control_checkpoint()),
       pg_postmaster_start_time(), 'test', now()`)
	var before time.Time
	if err := db.Pool.QueryRow(ctx, `SELECT outage_end FROM reaper_outages`).Scan(&before); err != nil {
		t.Fatal(err)
	}
	watch := pgstore.NewConnWatch(2 * time.Second)
	daemonCut := db.Cuttable(t, watch.Install)
	store := pgstore.New(daemonCut.Pool, pgstore.WithSchema(db.Schema), pgstore.WithConnWatch(watch),
		pgstore.WithCascades(jobs.Cascades{"report.export": {OnFailed: []string{`SELECT fail_for(@job_id)`}}}))
	if err := store.PrepareCascades(ctx); err != nil {
		t.Fatal(err)
	}
	lister := &fakeLister{queues: map[string]asynqstate.ActiveTasks{"q": {}}, failed: map[string]error{}}
	reg := prometheus.NewRegistry()
	r := reaper.New(store, lister, newMarkers(t, miniRedisClient(t)), reaper.Options{Queues: []string{"q"}, Rule: baselineRule,
		OutageGrace: true, Logger: testLogger(t), Metrics: reaper.NewMetrics(reg)})
	broken := []string{"broken-serial", "broken-zero"}
	stalledRows(t, db, "q", 21*time.Minute, broken...)
	for pass := 1; pass <= 3; pass++ {
		ok := fmt.Sprintf("ok-%d", pass)
		stalledRows(t, db, "q", 21*time.Minute, ok)
		lister.queues["q"] = asynqstate.ActiveTasks{IDs: append([]string{ok}, broken...)}
		res, err := r.RunOnce(ctx)
		if err != nil || res.Reaped != 1 || res.Errors != len(broken) || res.Skipped[string(reaper.SkipOutageGrace)] != 0 {
			t.Fatalf("pass %d = %+v, %v; want %s reaped, the broken cascades' errors, nothing held", pass, res, err, ok)
		}
		if st := db.Read(t, ok); st.Status != jobs.StatusFailed || st.FailureReason != jobs.ReasonStalled {
			t.Fatalf("pass %d: %s is %+v, want reaped", pass, ok, st)
		}
	}
	// One more pass (the broken jobs, no longer active, fail again in the
	// lost-task search): it would record an outage end had the cascade's
	// errors counted as lost connections.
	lister.queues["q"] = asynqstate.ActiveTasks{}
	if res, err := r.RunOnce(ctx); err != nil || res.Reaped != 0 {
		t.Fatalf("the pass after = %+v, %v", res, err)
	}
	var end time.Time
	var cause string
	if err := db.Pool.QueryRow(ctx, `SELECT outage_end, cause FROM reaper_outages`).Scan(&end, &cause); err != nil || !end.Equal(before) || cause != "first_record" {
		t.Fatalf("outage row %s (%s, %v), want it untouched at %s", end, cause, err, before)
	}
	if n := db.Count(t, `SELECT count(*) FROM jobs WHERE id = ANY($1) AND status = 'PROCESSING'`, broken); n != int64(len(broken)) {
		t.Fatalf("%d of the broken jobs are still PROCESSING, want %d (their cascade fails, so nothing of them is written)", n, len(broken))
	}
}

// TestCase_B47_ARestartWhileTheDaemonWasDown: live jobs on a PostgreSQL
// cluster the test started; the daemon runs passes, then stops; the
// cluster goes down for the stall timeout plus one heartbeat interval and
// starts again (a restart whose downtime alone makes every live job look
// stalled); a daemon started after it has seen no lost connection, yet its
// first pass finds the later postmaster start and records it as the outage
// end, holding every job as outage_grace: no live job is reaped, through
// the grace and after it.
func TestCase_B47_ARestartWhileTheDaemonWasDown(t *testing.T) {
	ctx := t.Context()
	cluster := jobstest.StartCluster(t)
	const schema = "jobreaper"
	connect := func(configure ...func(*pgxpool.Config)) *pgxpool.Pool {
		t.Helper()
		pool, err := jobs.Connect(ctx, cluster.URL, schema, configure...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		return pool
	}
	admin := outageDB{connect(), schema}
	if _, err := jobs.Migrate(ctx, admin.pool, schema); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.pool.Exec(ctx, `INSERT INTO jobreaper.job_types (name, max_runtime) VALUES ('b47.work', '1 second')`); err != nil {
		t.Fatal(err)
	}
	a := newRealAsynq(t)
	q := "b47r-" + a.suffix
	markers := newMarkers(t, a.rc)
	live := idsOf("J47r-"+a.suffix, 20)
	t.Cleanup(func() {
		for _, id := range live {
			a.rc.Del(context.Background(), queue.MarkerKey(id))
		}
	})
	// The workers' connections come back only after the new daemon's
	// first pass (the worst order: that pass runs before any heartbeat
	// could land), so their pool can be cut.
	workerCut := jobstest.NewCuttable(t, cluster.URL)
	w := startOutageWorkers(t, a, q, jobs.NewStore(workerCut.Pool, jobs.WithSchema(schema), jobs.WithOpTimeout(2*time.Second)), markers, len(live)+2)
	w.enqueue(t, admin, live)
	waitFor(t, 60*time.Second, "every job is claimed, heartbeating and past max_runtime", func() bool {
		return admin.count(t, `j.status = 'PROCESSING' AND j.progress_mark > 0 AND j.started_at < now() - interval '1 second'`, live) == len(live)
	})
	lister, err := asynqstate.NewIDLister(a.rc)
	if err != nil {
		t.Fatal(err)
	}
	daemon := func() *reaper.Reaper {
		watch := pgstore.NewConnWatch(2 * time.Second)
		s := pgstore.New(connect(watch.Install), pgstore.WithSchema(schema), pgstore.WithOpTimeout(2*time.Second), pgstore.WithConnWatch(watch))
		return reaper.New(s, lister, markers, reaper.Options{Queues: []string{q}, Interval: outageInterval, Rule: outageRule,
			OutageGrace: true, Logger: testLogger(t), Asynq: asynqstate.NewStatusReader(a.rc, 0)})
	}

	first := daemon()
	for range 2 {
		if res, err := first.RunOnce(ctx); err != nil || res.Reaped != 0 {
			t.Fatalf("a pass before the restart = %+v, %v", res, err)
		}
	}
	// The daemon is down from here on; PostgreSQL goes down and comes
	// back.
	workerCut.Cut()
	cluster.Stop(t)
	time.Sleep(outageLength) // the downtime itself, not a wait for an effect
	cluster.Start(t)
	loop := startPassLoop(t, daemon())
	passes := loop.waitPasses(t, time.Time{}, 1)
	workerCut.Restore()
	t.Logf("the first pass after the restart reaped %d, skipped %v", passes[0].Reaped, passes[0].Skipped)
	if passes[0].Reaped != 0 || passes[0].Skipped[string(reaper.SkipOutageGrace)] != len(live) {
		t.Fatalf("the first pass after the restart reaped %d and held %d as outage_grace; want every one of the %d jobs held",
			passes[0].Reaped, passes[0].Skipped[string(reaper.SkipOutageGrace)], len(live))
	}
	var started time.Time
	if err := admin.pool.QueryRow(ctx, `SELECT pg_postmaster_start_time()`).Scan(&started); err != nil {
		t.Fatal(err)
	}
	end, cause := admin.outage(t)
	if cause != "restart" || !end.Equal(started) {
		t.Fatalf("outage end %s (%s), want the restart at %s", end, cause, started)
	}
	waitFor(t, 60*time.Second, "every live job's heartbeat lands after the restart", func() bool {
		return admin.count(t, `j.updated_at > $2`, live, started) == len(live)
	})
	waitFor(t, 60*time.Second, "the grace is over", func() bool { return admin.now(t).After(end.Add(outageStall)) })
	loop.waitPasses(t, time.Now(), 2)
	loop.stop()
	admin.requireNoneReaped(t, live)
	held := 0
	for _, res := range loop.since(time.Time{}) {
		held += res.Skipped[string(reaper.SkipOutageGrace)]
		if res.Reaped != 0 {
			t.Fatalf("a pass after the restart reaped %d jobs: %+v", res.Reaped, res)
		}
	}
	t.Logf("passes after the restart held %d jobs as outage_grace", held)
}
