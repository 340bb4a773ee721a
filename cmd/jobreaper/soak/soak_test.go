package soak

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/jobreaper/jobreaper/internal/fleettest"
	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
	"github.com/jobreaper/jobreaper/queue"
	"github.com/jobreaper/jobreaper/queue/redistest"
)

// SoakDurationEnv sets the length of TestReliabilitySoak's load (a Go
// duration); the CI-sized default is soakDurationDefault. A run of an hour
// needs go test -timeout above it (for example -timeout 90m).
const SoakDurationEnv = "JOBREAPER_SOAK_DURATION"

// The soak's settings.
const (
	soakDurationDefault = 2 * time.Minute
	// The daemon's: a pass every second, the worker library's heartbeat
	// limiter at 1 s, and the least stall timeout the daemon accepts for
	// them (2 x 1 s + 1 s), which the hanging kinds' types use.
	soakInterval     = time.Second
	soakStallTimeout = 3 * time.Second
	// soakLiveStallTimeout is the stall timeout of the kinds that progress
	// (their job_types row): 2 s above the daemon's, so that a worker
	// process the shared CI machine leaves without a core for a moment is
	// not reaped while it progresses. Their long step (soakLongStep) still
	// outlasts it, so only their heartbeats keep them alive.
	soakLiveStallTimeout = 5 * time.Second
	soakLongStep         = 6 * time.Second
	// soakMaxRuntime is every soak type's max_runtime: every job runs
	// longer, so the stall timeout alone decides.
	soakMaxRuntime = "1 second"
	// soakEvery is the enqueue rate: one job every 250 ms. With the mix
	// below, that keeps about 15 of the fleet's 24 handler slots busy and
	// two cores modestly loaded.
	soakEvery   = 250 * time.Millisecond
	soakWorkers = 3
	// soakDrainMax bounds the wait, after the last enqueue, for every job
	// to end: the longest job (a long step and a retry) takes about 12 s.
	soakDrainMax = 2 * time.Minute
)

// soakMix is the share of each job kind among the enqueued jobs (weights
// out of 100); soakWorker implements them.
var soakMix = []struct {
	kind   string
	weight int
}{
	{"normal", 40}, // completes: batches, a long step kept alive by heartbeats in a third of them
	{"flaky", 15},  // fails its first attempt after two batches; asynq retries it, it resumes and completes
	{"doomed", 10}, // fails both its attempts (MaxRetry 1): FAILED soak_doomed
	{"stall", 20},  // hangs with an idle heartbeat ticker: reaped
	{"late", 15},   // hangs without heartbeats, is reaped, then tries to heartbeat, advance and complete
}

// soakCascades are the cascades of every soak type, for the daemon's config
// file and the workers' Store alike: one row per completion and per failure,
// so that a job completed or failed twice shows up as two rows.
func soakCascades() jobs.Cascades {
	c := jobs.Cascades{}
	for _, m := range soakMix {
		c["soak."+m.kind] = jobs.Cascade{
			OnFailed:    []string{`INSERT INTO soak_failures (job_id) VALUES (@job_id)`},
			OnCompleted: []string{`INSERT INTO soak_completions (job_id) VALUES (@job_id)`},
		}
	}
	return c
}

// soakTables are the product's tables of the soak, in the test's schema.
var soakTables = []string{
	`CREATE TABLE soak_items (job_id text NOT NULL, n int8 NOT NULL)`,
	`CREATE INDEX ON soak_items (job_id)`,
	`CREATE TABLE soak_results (job_id text NOT NULL, generation int8 NOT NULL)`,
	`CREATE INDEX ON soak_results (job_id)`,
	`CREATE TABLE soak_charges (job_id text NOT NULL)`,
	`CREATE INDEX ON soak_charges (job_id)`,
	`CREATE TABLE soak_completions (job_id text NOT NULL)`,
	`CREATE INDEX ON soak_completions (job_id)`,
	`CREATE TABLE soak_failures (job_id text NOT NULL)`,
	`CREATE INDEX ON soak_failures (job_id)`,
	`CREATE TABLE soak_anomalies (job_id text NOT NULL, generation int8 NOT NULL, what text NOT NULL, at timestamptz NOT NULL DEFAULT now())`,
}

func soakDuration(t *testing.T) time.Duration {
	t.Helper()
	raw := os.Getenv(SoakDurationEnv)
	if raw == "" {
		return soakDurationDefault
	}
	d, err := time.ParseDuration(raw)
	if err != nil || d < 20*time.Second {
		t.Fatalf("%s=%q: want a Go duration of at least 20s, such as 2m or 1h", SoakDurationEnv, raw)
	}
	return d
}

// The daemon (the real binary, `jobreaper run`, 1 s interval, 3 s stall
// timeout, cancel on reap) runs against a fleet of three worker processes
// (asynq servers with the start guard and the worker library) while jobs
// of five kinds are enqueued through the enqueue helper, four a second,
// for JOBREAPER_SOAK_DURATION (default 2 min): jobs that complete (some
// kept alive through a 6 s step by heartbeats alone), jobs that fail once
// and are retried by asynq, jobs that fail for good, jobs that hang and
// are reaped, and jobs that hang, are reaped and then try to finish late.
// After a drain, every job is checked (soakCheck): 0 invariant violations
// and 0 rows lost; each reaped job reaped within the bound below; the
// daemon's peak RSS over the last quarter of the load within 10 % of the
// first quarter's (rule in soakRSSRule).
//
// The reap delay of a job is its FAILED time minus its last evidence of
// progress (finished_at - updated_at, both on the database clock). The
// issue's bound is interval + stall timeout + one pass. Measured rather
// than assumed: the stall timeout, plus the longest time the daemon took
// between the starts of two consecutive passes (at least the interval;
// longer when a pass overran it or the machine was busy), plus its
// longest pass, both read from the daemon's own log. A job that becomes
// stalled just after a pass read the clock is reaped by the next pass,
// which starts at most that gap after the previous one and ends at most a
// pass later, so nothing but a missed reap can exceed it; the test never
// compares a duration with a fixed number.
func TestReliabilitySoak(t *testing.T) {
	t.Parallel()
	length := soakDuration(t)
	if deadline, ok := t.Deadline(); ok && time.Until(deadline) < length+soakDrainMax+time.Minute {
		t.Fatalf("%s=%s needs go test -timeout of at least %s more than it (%s left)", SoakDurationEnv, length,
			soakDrainMax+time.Minute, time.Until(deadline).Round(time.Second))
	}
	ctx := context.Background()
	bin := fleettest.BuildJobreaperRelease(t)
	db := jobstest.New(t)
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	q := "soak"
	for _, sql := range soakTables {
		db.Exec(t, sql)
	}
	for _, m := range soakMix {
		stall := ""
		if m.kind != "stall" && m.kind != "late" {
			stall = soakLiveStallTimeout.String()
		}
		db.JobType(t, "soak."+m.kind, soakMaxRuntime, stall, "")
	}
	config := filepath.Join(t.TempDir(), "jobreaper.yaml")
	if err := os.WriteFile(config, soakConfigYAML(soakCascades()), 0o600); err != nil {
		t.Fatal(err)
	}

	daemon := startSoakDaemon(t, bin, "--config", config, "--database-url", db.URL, "--schema", db.Schema,
		"--redis-url", srv.URL, "--queues", q, "--interval", soakInterval.String(), "--stall-timeout", soakStallTimeout.String(),
		"--heartbeat-interval", soakHeartbeatInterval.String(), "--log-format", "json", "--log-level", "debug")
	fleettest.WaitFor(t, "the daemon ran its first pass", func() bool { return daemon.passStats().Passes > 0 })
	workers := make([]*exec.Cmd, soakWorkers)
	for i := range workers {
		workers[i] = startSoakWorker(t, db, srv.Addr, q, fmt.Sprintf("soak-w%d", i+1))
	}
	insp := asynq.NewInspectorFromRedisClient(rdb)
	fleettest.WaitFor(t, "the worker processes serve the queue", func() bool {
		servers, err := insp.Servers()
		return err == nil && len(servers) == soakWorkers
	})

	// The load, with the daemon's RSS sampled beside it.
	type rssResult struct {
		peaks rssPeaks
		err   error
	}
	rssDone, stopRSS := make(chan rssResult, 1), make(chan struct{})
	go func() {
		p, err := sampleRSS(daemon.Pid(), length, stopRSS)
		rssDone <- rssResult{p, err}
	}()
	seed := rand.Uint64()
	t.Logf("soak: %s of load, seed %d", length, seed)
	enq := &soakEnqueuer{db: db, store: db.Store(), client: asynq.NewClientFromRedisClient(rdb), queue: q,
		rng: rand.New(rand.NewPCG(seed, 0)), byKind: map[string]int{}}
	// The test's own live heap at the end of each quarter of the load: it
	// keeps counts, never the jobs, so an hour's soak holds what two
	// minutes' does.
	var testHeap [4]uint64
	begin := time.Now()
	tick := time.NewTicker(soakEvery)
	for quarter := 0; time.Since(begin) < length; {
		enq.enqueue(ctx, t)
		if quarter < 3 && time.Since(begin) >= time.Duration(quarter+1)*length/4 {
			testHeap[quarter] = liveHeap()
			quarter++
		}
		<-tick.C // pacing the load, not waiting for an effect
	}
	tick.Stop()
	testHeap[3] = liveHeap()
	loadEnd := time.Now()
	close(stopRSS)
	rss := <-rssDone
	if rss.err != nil {
		t.Errorf("sampling the daemon's RSS: %v", rss.err)
	}

	// Drain: every job ends, then the workers stop (each waits for its
	// handlers, late writes included), then the daemon: nothing changes
	// the rows while they are checked.
	drained := pollUntil(soakDrainMax, func() bool {
		return db.Count(t, `SELECT count(*) FROM `+db.Table("jobs")+` WHERE status NOT IN ('COMPLETED', 'FAILED')`) == 0
	})
	drainTook := time.Since(loadEnd)
	for _, w := range workers {
		stopSoakWorker(t, w)
	}
	if code := daemon.Stop(t); code != 0 {
		t.Errorf("the daemon's exit after SIGTERM: %d (want 0)", code)
	}

	res := soakCheck(t, db, rdb)
	ps := daemon.passStats()
	bound := soakStallTimeout + max(soakInterval, ps.LongestGap) + ps.LongestPass
	delays := soakReapDelays(t, db, bound)
	res.violations += delays.overBound
	if delays.overBound > 0 {
		res.note(fmt.Sprintf("%d reaped jobs were reaped later than the bound %s (longest %d ms)", delays.overBound, bound, delays.maxMS))
	}
	if !drained {
		t.Errorf("not every job ended within %s of the last enqueue", soakDrainMax)
	}
	if ps.Unbalanced > 0 {
		t.Errorf("%d passes logged that their scanned tasks do not add up, the last: %s", ps.Unbalanced, ps.UnbalancedLine)
	}
	if res.enqueued != enq.enqueued {
		res.note(fmt.Sprintf("%d jobs enqueued, %d rows found", enq.enqueued, res.enqueued))
		res.lost += max(0, enq.enqueued-res.enqueued)
	}

	kinds := make([]string, 0, len(enq.byKind))
	for k, n := range enq.byKind {
		kinds = append(kinds, fmt.Sprintf("%s %d", k, n))
	}
	sort.Strings(kinds)
	t.Logf("soak: %d jobs enqueued (%s) in %s; drained in %s; %d completed, %d reaped, %d failed by their handler",
		enq.enqueued, strings.Join(kinds, ", "), loadEnd.Sub(begin).Round(time.Millisecond), drainTook.Round(time.Millisecond),
		res.completed, res.reaped, res.failedByHandler)
	t.Logf("soak: daemon ran %d passes (%d with errors, %d longer than the interval), longest %s, longest start-to-start %s; reap bound %s = stall timeout %s + %s + %s",
		ps.Passes, ps.ErrorPasses, ps.Overran, ps.LongestPass, ps.LongestGap, bound, soakStallTimeout, max(soakInterval, ps.LongestGap), ps.LongestPass)
	t.Logf("soak: the longest pass: %s", ps.LongestPassLine)
	t.Logf("soak: reap delay over %d jobs: p50 %d ms, p99 %d ms, max %d ms", delays.n, delays.p50MS, delays.p99MS, delays.maxMS)
	rq := rss.peaks.Quarters
	t.Logf("soak: daemon RSS peaks by quarter of the load: %.1f, %.1f, %.1f, %.1f MiB (%d samples)",
		mib(rq[0]), mib(rq[1]), mib(rq[2]), mib(rq[3]), rss.peaks.Samples)
	t.Logf("soak: the test's own live heap at the end of each quarter: %.1f, %.1f, %.1f, %.1f MiB",
		mib(int64(testHeap[0])), mib(int64(testHeap[1])), mib(int64(testHeap[2])), mib(int64(testHeap[3])))
	for _, n := range res.notes {
		t.Errorf("violation: %s", n)
	}

	jobstest.Figure(t, "soak", "duration_s", int(length.Seconds()))
	jobstest.Figure(t, "soak", "jobs_enqueued", enq.enqueued)
	jobstest.Figure(t, "soak", "jobs_completed", res.completed)
	jobstest.Figure(t, "soak", "jobs_reaped", res.reaped)
	jobstest.Figure(t, "soak", "jobs_failed", res.failedByHandler)
	jobstest.Figure(t, "soak", "reap_delay_p50_ms", delays.p50MS)
	jobstest.Figure(t, "soak", "reap_delay_p99_ms", delays.p99MS)
	jobstest.Figure(t, "soak", "rss_first_quarter_mib", mib(rss.peaks.First()))
	jobstest.Figure(t, "soak", "rss_last_quarter_mib", mib(rss.peaks.Last()))
	jobstest.Figure(t, "soak", "violations", res.violations)
	jobstest.Figure(t, "soak", "rows_lost", res.lost)

	if res.violations != 0 || res.lost != 0 {
		t.Errorf("%d invariant violations and %d rows lost, want 0 and 0", res.violations, res.lost)
	}
	if res.reaped == 0 || res.completed == 0 {
		t.Errorf("%d jobs reaped and %d completed: the soak did not exercise both paths", res.reaped, res.completed)
	}
	if ok, why := soakRSSRule(rss.peaks.First(), rss.peaks.Last()); !ok {
		t.Errorf("daemon RSS: %s", why)
	} else {
		t.Logf("soak: daemon RSS: %s", why)
	}
}

// soakRSSSlack is the absolute growth of the daemon's peak RSS the RSS
// rule accepts whatever the 10 %: a Go process's resident set moves by a
// few MiB with its garbage collection cycle (the heap grows to twice its
// live size between two collections) and the runtime's lazy return of
// memory to the system, and at the daemon's size (about 28 MiB under the
// soak) 10 % is less than 3 MiB. A leak grows without bound, so a longer
// soak (JOBREAPER_SOAK_DURATION=1h) takes it past any fixed slack.
const soakRSSSlack = 4 << 20

// soakRSSRule is the rule, the last quarter's peak RSS within 10 %
// of the first quarter's, with soakRSSSlack for small processes: it holds
// when last <= first x 1.10 or last - first <= soakRSSSlack.
func soakRSSRule(first, last int64) (bool, string) {
	switch {
	case first <= 0 || last <= 0:
		return false, fmt.Sprintf("no sample in a quarter (first %d B, last %d B)", first, last)
	case float64(last) <= 1.10*float64(first):
		return true, fmt.Sprintf("last quarter's peak %.1f MiB is within 10 %% of the first quarter's %.1f MiB", mib(last), mib(first))
	case last-first <= soakRSSSlack:
		return true, fmt.Sprintf("last quarter's peak %.1f MiB is more than 10 %% above the first quarter's %.1f MiB, but only %.1f MiB, within the %d MiB slack for small processes",
			mib(last), mib(first), mib(last-first), soakRSSSlack>>20)
	default:
		return false, fmt.Sprintf("last quarter's peak %.1f MiB is %.1f MiB (%.0f %%) above the first quarter's %.1f MiB: more than 10 %% and more than %d MiB",
			mib(last), mib(last-first), 100*float64(last-first)/float64(first), mib(first), soakRSSSlack>>20)
	}
}

// liveHeap returns this process's heap in use after a garbage collection,
// in bytes.
func liveHeap() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// soakConfigYAML writes the daemon's config file: the cascades only.
func soakConfigYAML(c jobs.Cascades) []byte {
	types := make([]string, 0, len(c))
	for typ := range c {
		types = append(types, typ)
	}
	sort.Strings(types)
	var b strings.Builder
	// Stalls come one or two a pass here, never as a storm: the limits
	// are off so that a pass delayed on a busy machine, which finds a
	// few seconds' worth at once, still reaps them as they come.
	b.WriteString("max_stalled_per_pass: 0\nmax_stalled_fraction: 0\n")
	b.WriteString("cascades:\n")
	for _, typ := range types {
		fmt.Fprintf(&b, "  %s:\n    on_failed:\n", typ)
		for _, s := range c[typ].OnFailed {
			fmt.Fprintf(&b, "      - '%s'\n", s)
		}
		b.WriteString("    on_completed:\n")
		for _, s := range c[typ].OnCompleted {
			fmt.Fprintf(&b, "      - '%s'\n", s)
		}
	}
	return []byte(b.String())
}

// startSoakWorker starts one worker process of the fleet: this test binary
// running TestSoakWorkerProcess. Its log is kept (the end of it) and shown
// when the test fails; it is killed at cleanup if still running.
func startSoakWorker(t *testing.T, db *jobstest.DB, redisAddr, q, name string) *exec.Cmd {
	t.Helper()
	tail := &fleettest.Log{Tail: 32 << 10}
	// -test.timeout=0: a child of an hour's soak must not stop at go test's
	// default 10 minutes.
	cmd := exec.Command(os.Args[0], "-test.run=^TestSoakWorkerProcess$", "-test.count=1", "-test.timeout=0")
	cmd.Env = append(os.Environ(), envSoakDB+"="+db.URL, envSoakSchema+"="+db.Schema, envSoakRedis+"="+redisAddr,
		envSoakQueue+"="+q, envSoakWorker+"="+name)
	cmd.Stdout, cmd.Stderr = tail, tail
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
		if t.Failed() {
			t.Logf("worker %s's log (its end):\n%s", name, tail.String())
		}
	})
	return cmd
}

// stopSoakWorker stops a worker process with SIGTERM and waits until it has
// exited (it waits for its handlers first).
func stopSoakWorker(t *testing.T, cmd *exec.Cmd) {
	t.Helper()
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatalf("stopping a worker process: %v", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	select {
	case err := <-exited:
		if err != nil {
			t.Logf("worker process exit: %v", err)
		}
	case <-time.After(fleettest.Deadline):
		_ = cmd.Process.Kill()
		<-exited
		t.Errorf("a worker process did not exit within %s of SIGTERM", fleettest.Deadline)
	}
}

// pollUntil polls cond every 500 ms until it holds (true) or within has
// passed (false).
func pollUntil(within time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(500 * time.Millisecond) // polling the database
	}
	return true
}

// soakEnqueuer enqueues the soak's jobs as a product does: the row first
// (QUEUED, with its queue and total), then the task through queue.Enqueue.
// It keeps counts only, never the jobs: the rows are the record.
type soakEnqueuer struct {
	db       *jobstest.DB
	store    *jobs.Store
	client   *asynq.Client
	queue    string
	rng      *rand.Rand
	seq      int
	enqueued int
	byKind   map[string]int
}

func (e *soakEnqueuer) enqueue(ctx context.Context, t *testing.T) {
	t.Helper()
	pick, kind := e.rng.IntN(100), ""
	for _, m := range soakMix {
		if pick -= m.weight; pick < 0 {
			kind = m.kind
			break
		}
	}
	e.seq++
	id := fmt.Sprintf("soak-%07d-%s", e.seq, kind)
	total := int64(4 * soakBatch)
	var p soakPayload
	var opts []asynq.Option
	switch kind {
	case "normal", "flaky":
		if e.rng.IntN(3) == 0 {
			p.LongMS = int(soakLongStep.Milliseconds())
		}
		if kind == "flaky" {
			opts = append(opts, asynq.MaxRetry(3))
		}
	case "doomed":
		opts = append(opts, asynq.MaxRetry(1))
	}
	payload, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	e.db.Insert(t, jobstest.Job{ID: id, Type: "soak." + kind, Status: jobs.StatusQueued, Queue: e.queue, Total: &total})
	if _, err := queue.Enqueue(ctx, e.client, e.store, asynq.NewTask("soak."+kind, payload), id, opts...); err != nil {
		t.Errorf("enqueueing %s: %v", id, err)
		return
	}
	e.enqueued++
	e.byKind[kind]++
}
