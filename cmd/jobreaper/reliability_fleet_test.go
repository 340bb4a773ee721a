package main

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/jobreaper/jobreaper/internal/fleettest"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
	"github.com/jobreaper/jobreaper/queue"
	"github.com/jobreaper/jobreaper/reaper"
)

// The fleet suite of the reliability report (jobstest.Figure suite
// "fleet").
const (
	fleetSuite = "fleet"
	// envFleetDuration sets how long TestReliabilityFleet injects faults
	// (a Go duration, default fleetDurationDefault; at least 20 s).
	envFleetDuration     = "JOBREAPER_FLEET_DURATION"
	fleetDurationDefault = 30 * time.Second
	// envFleetSeed replays a run's fault schedule (the seed it printed).
	envFleetSeed = "JOBREAPER_FLEET_SEED"
	fleetQueue   = "fleet"
	// fleetRate is the producer's jobs per second.
	fleetRate = 3
	// fleetStormHold is the daemons' --stall-storm-hold.
	fleetStormHold = 15 * time.Second
	// fleetReapRetryType is the job type of the stalling jobs that a reap
	// releases for another attempt (job_types.reap_retries =
	// fleetReapRetries): its first reap is a retry reap (QUEUED, no marker:
	// the checker takes a reaped event with "retry": true without one), and
	// its attempt after that completes.
	fleetReapRetryType = "fleet.reap_retry"
	fleetReapRetries   = 1
)

// fleetDuration returns JOBREAPER_FLEET_DURATION or the default.
func fleetDuration(t *testing.T) time.Duration {
	t.Helper()
	s := os.Getenv(envFleetDuration)
	if s == "" {
		return fleetDurationDefault
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 20*time.Second {
		t.Fatalf("%s=%q: want a Go duration of at least 20s", envFleetDuration, s)
	}
	return d
}

// fleetSeed returns JOBREAPER_FLEET_SEED or a fresh seed.
func fleetSeed(t *testing.T) uint64 {
	t.Helper()
	s := os.Getenv(envFleetSeed)
	if s == "" {
		return rand.Uint64()
	}
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		t.Fatalf("%s=%q: want the unsigned integer a run printed", envFleetSeed, s)
	}
	return n
}

// fleetKinds are the producer's job kinds with their weights.
var fleetKinds = []struct {
	kind   string
	weight int
}{
	{fleettest.KindNormal, 35}, {fleettest.KindRetried, 15}, {fleettest.KindFailing, 10},
	{fleettest.KindStalling, 10}, {fleettest.KindLate, 5}, {fleettest.KindSlow, 25},
}

// fleetWorld is the running fleet of one TestReliabilityFleet run.
type fleetWorld struct {
	*blipFleet
	cluster *jobstest.Cluster // nil on the shared server: no pg_restart
	// daemonArgs and workerArgs are added to every daemon's and worker's
	// flags; failpoints is the next daemon's JOBREAPER_FAILPOINTS.
	daemonArgs, workerArgs []string
	failpoints             string

	daemons         []*fleettest.Daemon
	liveWorkers     []*fleettest.Worker
	nDaemons, nWork int

	mu        sync.Mutex
	kinds     map[string]string
	killed    map[string]time.Time
	outages   []fleettest.Outage
	takeovers []time.Duration
	faults    map[string]int
	enqueued  map[string]int
	enqFailed int
	rss       map[int][]int64 // pid -> VmRSS samples, kB
}

func (w *fleetWorld) startDaemon() *fleettest.Daemon {
	w.t.Helper()
	w.nDaemons++
	d := w.daemonWith(w.failpoints, fmt.Sprintf("daemon %d", w.nDaemons), fleetQueue,
		append([]string{"--stall-storm-hold", fleetStormHold.String()}, w.daemonArgs...)...)
	w.daemons = append(w.daemons, d)
	return d
}

func (w *fleetWorld) startWorker() *fleettest.Worker {
	w.t.Helper()
	w.nWork++
	wk := w.worker(fmt.Sprintf("w%d", w.nWork), fleetQueue, 20,
		append([]string{"--charges", "fleet_charges", "--retry-delay", "500ms"}, w.workerArgs...)...)
	w.liveWorkers = append(w.liveWorkers, wk)
	return wk
}

// newFleetWorld installs the history on db (jobstest's, or a schema of
// cluster, the test's own), starts a redis-server with its append-only
// file, and creates the job types; no process runs yet.
func newFleetWorld(t *testing.T, db *jobstest.DB, cluster *jobstest.Cluster) *fleetWorld {
	t.Helper()
	fleettest.InstallHistory(t, db.Pool, db.Schema)
	w := &fleetWorld{blipFleet: newBlipFleet(t, db, "--appendonly", "yes"), cluster: cluster,
		kinds: map[string]string{}, killed: map[string]time.Time{}, faults: map[string]int{}, enqueued: map[string]int{},
		rss: map[int][]int64{}}
	db.JobType(t, fleetReapRetryType, "1 second", "", "")
	if fleetReapRetries > 0 {
		db.Exec(t, `UPDATE `+db.Table("job_types")+` SET reap_retries = $1 WHERE name = $2`, fleetReapRetries, fleetReapRetryType)
	}
	return w
}

// liveDaemons are the daemons not killed.
func (w *fleetWorld) liveDaemons() []*fleettest.Daemon {
	return slices.DeleteFunc(slices.Clone(w.daemons), func(d *fleettest.Daemon) bool { return d.Exited() })
}

// leader returns the daemon that leads, waiting up to 20 s (nil: none).
func (w *fleetWorld) leader() *fleettest.Daemon {
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		for _, d := range w.liveDaemons() {
			if d.Leads() {
				return d
			}
		}
		time.Sleep(100 * time.Millisecond) // polling
	}
	return nil
}

// awaitTakeover waits until a daemon other than old leads, and records
// the time from since.
func (w *fleetWorld) awaitTakeover(old *fleettest.Daemon, since time.Time) {
	w.t.Helper()
	fleettest.WaitFor(w.t, "another daemon takes the leader lease from "+old.Name, func() bool {
		for _, d := range w.liveDaemons() {
			if d != old && d.Leads() {
				return true
			}
		}
		return false
	})
	w.mu.Lock()
	w.takeovers = append(w.takeovers, time.Since(since))
	w.mu.Unlock()
}

func (w *fleetWorld) outage(kind string, start, end time.Time, processes []string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.outages = append(w.outages, fleettest.Outage{Kind: kind, Start: start, End: end, Processes: processes})
}

// inject runs one fault to its end.
func (w *fleetWorld) inject(f fleettest.Fault) {
	t := w.t
	t.Helper()
	t.Logf("fault %v", f)
	switch f.Kind {
	case fleettest.FaultLeaderKill, fleettest.FaultLeaderStop, fleettest.FaultLeaderCut:
		l := w.leader()
		if l == nil {
			t.Fatalf("fault %v: no daemon leads", f)
		}
		start := time.Now()
		switch f.Kind {
		case fleettest.FaultLeaderKill:
			l.Signal(t, syscall.SIGKILL)
			l.Wait(t)
			w.awaitTakeover(l, start)
			w.startDaemon()
		case fleettest.FaultLeaderStop:
			l.Signal(t, syscall.SIGSTOP)
			w.awaitTakeover(l, start)
			sleepFor(t.Context(), time.Until(start.Add(f.Length)))
			l.Signal(t, syscall.SIGCONT)
		case fleettest.FaultLeaderCut:
			l.PG.Cut()
			w.awaitTakeover(l, start)
			sleepFor(t.Context(), time.Until(start.Add(f.Length)))
			l.PG.Restore()
			w.outage(f.Kind, start, time.Now(), []string{l.Name})
		}
	case fleettest.FaultWorkersCut:
		var names []string
		for _, wk := range w.liveWorkers {
			names = append(names, wk.Name)
		}
		start := time.Now()
		cut(pgRelays(w.liveWorkers...)...)
		sleepFor(t.Context(), f.Length)
		restore(pgRelays(w.liveWorkers...)...)
		w.outage(f.Kind, start, time.Now(), names)
	case fleettest.FaultPGRestart:
		start := time.Now()
		w.cluster.Stop(t)
		sleepFor(t.Context(), f.Length)
		w.cluster.Start(t)
		w.outage(f.Kind, start, time.Now(), nil)
	case fleettest.FaultRedisRestart:
		w.redis.Stop(t)
		sleepFor(t.Context(), f.Length)
		w.redis.Restart(t)
	case fleettest.FaultWorkerKill:
		victim := w.liveWorkers[f.Target%len(w.liveWorkers)]
		victim.Signal(t, syscall.SIGKILL)
		victim.Wait(t)
		w.mu.Lock()
		w.killed[victim.Name] = time.Now()
		w.mu.Unlock()
		w.liveWorkers = slices.DeleteFunc(w.liveWorkers, func(x *fleettest.Worker) bool { return x == victim })
		w.startWorker()
	default:
		t.Fatalf("fault %v: no injector", f)
	}
	w.mu.Lock()
	w.faults[f.Kind]++
	w.mu.Unlock()
}

// produce enqueues fleetRate jobs a second through queue.Enqueue until
// stop closes, the kinds drawn from rng. A failed insert or enqueue (the
// fault of the moment) is counted and the job dropped.
func (w *fleetWorld) produce(rng *rand.Rand, stop <-chan struct{}) {
	total := 0
	for _, k := range fleetKinds {
		total += k.weight
	}
	tick := time.NewTicker(time.Second / fleetRate)
	defer tick.Stop()
	for i := 0; ; i++ {
		select {
		case <-stop:
			return
		case <-tick.C:
		}
		n, kind := rng.IntN(total), ""
		for _, k := range fleetKinds {
			if n < k.weight {
				kind = k.kind
				break
			}
			n -= k.weight
		}
		id := fmt.Sprintf("F-%05d", i)
		typ, p, retries := blipLive, blipJob{Kind: "complete"}, 3
		switch kind {
		case fleettest.KindRetried:
			p = blipJob{Kind: "error", RetryKind: "complete"}
		case fleettest.KindFailing:
			p, retries = blipJob{Kind: "fail", Code: "upstream_down"}, 0
		case fleettest.KindStalling:
			typ, p = fleetReapRetryType, blipJob{Kind: "heartbeat", HangAfter: "1500ms", RetryKind: "complete"}
		case fleettest.KindLate:
			p, retries = blipJob{Kind: "late", HangAfter: "1500ms"}, 0
		case fleettest.KindSlow:
			p = blipJob{Kind: "heartbeat", RunFor: "4s"}
		}
		if err := w.enqueueOne(id, typ, p, retries); err != nil {
			w.mu.Lock()
			w.enqFailed++
			w.mu.Unlock()
			continue
		}
		w.mu.Lock()
		w.kinds[id] = kind
		w.enqueued[kind]++
		w.mu.Unlock()
	}
}

func (w *fleetWorld) enqueueOne(id, typ string, p blipJob, retries int) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	raw, err := json.Marshal(p)
	if err != nil {
		return err
	}
	if _, err := w.db.Pool.Exec(ctx, `INSERT INTO `+w.db.Table("jobs")+` (id, type, status, queue) VALUES ($1, $2, 'QUEUED', $3)`,
		id, typ, fleetQueue); err != nil {
		return err
	}
	_, err = queue.Enqueue(ctx, w.client, w.db.Store(), asynq.NewTask(typ, raw), id, asynq.Queue(fleetQueue), asynq.MaxRetry(retries))
	return err
}

// sampleRSS records every live daemon's resident set until stop closes.
func (w *fleetWorld) sampleRSS(stop <-chan struct{}, pids func() []int) {
	tick := time.NewTicker(2 * time.Second)
	defer tick.Stop()
	for {
		select {
		case <-stop:
			return
		case <-tick.C:
		}
		for _, pid := range pids() {
			if kb, ok := rssKB(pid); ok {
				w.mu.Lock()
				w.rss[pid] = append(w.rss[pid], kb)
				w.mu.Unlock()
			}
		}
	}
}

// rssKB reads VmRSS of pid from /proc.
func rssKB(pid int) (int64, bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, false
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "VmRSS:" {
			n, err := strconv.ParseInt(f[1], 10, 64)
			return n, err == nil
		}
	}
	return 0, false
}

// haveInitdb reports whether a test can start a PostgreSQL cluster of its
// own (jobstest.StartCluster).
func haveInitdb() bool {
	m, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
	return len(m) > 0
}

// TestReliabilityFleet runs a fleet under a seeded schedule of faults and
// checks the recorded history: three `jobreaper run` daemons of one queue
// set (leader lease, --interval 1s, stall timeout 10 s, heartbeat
// interval 2 s), three worker processes whose handlers heartbeat every
// 200 ms, each process with PostgreSQL and Redis relays of its own; a
// producer enqueues 3 jobs a second through queue.Enqueue, of six kinds
// (fleettest.Kind*). The faults (fleettest.Schedule, every kind once, then
// more while the run lasts; JOBREAPER_FLEET_DURATION, default 30 s): the
// leader SIGKILLed (replaced), SIGSTOPped past its lease TTL, cut from
// PostgreSQL; every worker cut from PostgreSQL for less than the stall
// timeout; PostgreSQL restarted under everyone (a cluster of the test's
// own; skipped, logged, without initdb); Redis stopped and restarted with
// its append-only file; a worker SIGKILLed mid-batch (replaced); a
// Sentinel failover only with redis-sentinel installed (logged as skipped
// otherwise). The seed is printed; JOBREAPER_FLEET_SEED replays its
// schedule.
//
// The history: a test-only trigger on the test's schema
// (fleettest.InstallHistory) logs every change of updated_at, generation
// and status, and every leader lease version, with the database time; the
// reaped events name their holder_id. fleettest.Check judges it; every
// violation fails the test.
//
// Figures: duration, jobs by kind, faults by kind, takeovers and their
// time, false reaps, double effects, violations, reap delay by kind,
// daemons' RSS, the seed. Not parallel: its margins are in seconds.
func TestReliabilityFleet(t *testing.T) {
	duration, seed := fleetDuration(t), fleetSeed(t)
	t.Logf("fleet seed %d (replay: %s=%d), duration %s", seed, envFleetSeed, seed, duration)
	kinds := slices.Clone(fleettest.FaultKinds)
	var db *jobstest.DB
	var cluster *jobstest.Cluster
	if haveInitdb() {
		cluster = jobstest.StartCluster(t)
		db = clusterDB(t, cluster)
	} else {
		t.Logf("fault %s skipped: initdb is not installed, so the test has no PostgreSQL of its own to restart", fleettest.FaultPGRestart)
		db = jobstest.New(t)
		kinds = slices.DeleteFunc(kinds, func(k string) bool { return k == fleettest.FaultPGRestart })
	}
	if _, err := exec.LookPath("redis-sentinel"); err != nil {
		t.Logf("fault %s skipped: redis-sentinel is not installed", fleettest.FaultFailover)
		kinds = slices.DeleteFunc(kinds, func(k string) bool { return k == fleettest.FaultFailover })
	} else {
		t.Logf("fault %s skipped: the suite has no Sentinel topology yet", fleettest.FaultFailover)
		kinds = slices.DeleteFunc(kinds, func(k string) bool { return k == fleettest.FaultFailover })
	}
	w := newFleetWorld(t, db, cluster)
	for range 3 {
		w.startDaemon()
	}
	for range 3 {
		w.startWorker()
	}
	ttl := reaper.LeaderLeaseTTL(blipInterval)
	schedule := fleettest.Schedule(seed, fleettest.ScheduleParams{Duration: duration, Kinds: kinds, StallTimeout: blipStall,
		LeaseTTL: ttl, Settle: 4 * time.Second, Start: 3 * time.Second})
	t.Logf("the schedule of seed %d: %v", seed, schedule)

	first := w.daemons[:3]
	stop := make(chan struct{})
	var bg sync.WaitGroup
	bg.Add(2)
	go func() { defer bg.Done(); w.produce(rand.New(rand.NewPCG(seed, 1)), stop) }()
	go func() {
		defer bg.Done()
		w.sampleRSS(stop, func() []int {
			var pids []int
			for _, d := range first {
				if !d.Exited() {
					pids = append(pids, d.Pid())
				}
			}
			return pids
		})
	}()
	start := time.Now()
	for _, f := range schedule {
		sleepFor(t.Context(), time.Until(start.Add(f.At)))
		w.inject(f)
	}
	sleepFor(t.Context(), time.Until(start.Add(duration)))
	close(stop)
	bg.Wait()
	ran := time.Since(start)

	// Drain: every claimed job ends (completed, failed, reaped).
	drainBound := blipStall + fleetStormHold + 30*time.Second
	fleettest.WaitFor(t, "every claimed job ends", func() bool {
		return db.Count(t, `SELECT count(*) FROM `+db.Table("jobs")+` WHERE status = 'PROCESSING'`) == 0 || time.Since(start) > ran+drainBound
	})
	if l := w.leader(); l != nil {
		waitPasses(t, l, okPasses(l), 3) // the markers of the last reaps written
	}
	end := time.Now()

	v := w.judge(end.Add(-drainBound), blipStall+2*blipInterval+(2*ttl+blipInterval+blipHeartbeat)+fleetStormHold)

	// Figures.
	fig := func(name string, value any) { jobstest.Figure(t, fleetSuite, name, value) }
	fig("duration_s", int(ran.Seconds()))
	for _, k := range fleetKinds {
		fig("jobs_"+k.kind, w.enqueued[k.kind])
	}
	for _, k := range fleettest.FaultKinds {
		fig("faults_"+k, w.faults[k])
	}
	fig("takeovers", len(w.takeovers))
	fig("takeover_p50_ms", fleettest.Percentile(w.takeovers, 50).Milliseconds())
	fig("takeover_max_ms", fleettest.Percentile(w.takeovers, 100).Milliseconds())
	fig("false_reaps", v.FalseReaps)
	fig("double_effects", v.DoubleEffects)
	fig("killed_reaps", v.KilledReaps)
	for _, k := range fleetKinds {
		if d := v.ReapDelays[k.kind]; len(d) > 0 {
			fig("reap_delay_p50_ms_"+k.kind, fleettest.Percentile(d, 50).Milliseconds())
			fig("reap_delay_p99_ms_"+k.kind, fleettest.Percentile(d, 99).Milliseconds())
		}
	}
	fig("seed", strconv.FormatUint(seed, 10))
	violations := v.Violations
	if duration >= 2*time.Minute {
		violations = append(violations, w.rssFlat(fig)...)
	}
	fig("violations", len(violations))
	t.Logf("fleet: %d jobs enqueued (%d enqueues failed under faults), %d reaps judged, %d of killed workers, %d faults, takeovers %v",
		len(w.kinds), w.enqFailed, v.Reaps, v.KilledReaps, len(schedule), w.takeovers)
	if len(violations) > 0 {
		t.Fatalf("seed %d: %d violations:\n%s", seed, len(violations), strings.Join(violations, "\n"))
	}
	if v.Reaps == 0 {
		t.Fatalf("seed %d: no reap was judged: the run proves nothing", seed)
	}
}

// judge reads the recorded history and the markers of every reaped job,
// and checks them (fleettest.Check) with the stalling bound stallBound,
// judging the delays of stalling attempts whose bound ends by end.
func (w *fleetWorld) judge(end time.Time, stallBound time.Duration) fleettest.Verdict {
	t := w.t
	t.Helper()
	w.mu.Lock()
	h := fleettest.History{Kinds: maps.Clone(w.kinds), Killed: maps.Clone(w.killed), Outages: slices.Clone(w.outages),
		Markers: map[string]bool{}, End: end, StallBound: stallBound}
	w.mu.Unlock()
	fleettest.ReadHistory(t, w.db.Pool, w.db.Schema, &h)
	rdb := w.redis.Client(t)
	for _, r := range h.Reaps {
		n, err := rdb.Exists(context.Background(), queue.MarkerKey(r.JobID)).Result()
		if err != nil {
			t.Fatal(err)
		}
		h.Markers[r.JobID] = n == 1
	}
	return fleettest.Check(h)
}

// rssFlat records the daemons' RSS over the run's first and last quarter
// (the largest of the daemons that lived through it) and returns a
// violation for a daemon whose last quarter is over 1.5x its first plus
// 16 MiB: a leak.
func (w *fleetWorld) rssFlat(fig func(string, any)) []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []string
	var firstMax, lastMax float64
	for pid, s := range w.rss {
		if len(s) < 8 {
			continue
		}
		q := len(s) / 4
		a, b := mean(s[:q]), mean(s[len(s)-q:])
		firstMax, lastMax = max(firstMax, a/1024), max(lastMax, b/1024)
		if b > 1.5*a+16*1024 {
			out = append(out, fmt.Sprintf("daemon pid %d: RSS grew from %.1f MiB to %.1f MiB over the run", pid, a/1024, b/1024))
		}
	}
	fig("rss_first_quarter_mib", int(firstMax+0.5))
	fig("rss_last_quarter_mib", int(lastMax+0.5))
	return out
}

func mean(s []int64) float64 {
	var sum int64
	for _, v := range s {
		sum += v
	}
	return float64(sum) / float64(len(s))
}
