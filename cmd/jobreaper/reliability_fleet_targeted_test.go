package main

import (
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jobreaper/jobreaper/internal/fleettest"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
	"github.com/jobreaper/jobreaper/reaper"
)

// envFleetBroken runs TestReliabilityFleetBroken (bash .ci/reliability
// sets it): it builds the deliberately broken copies, which takes minutes.
// envFleetTargeted runs TestReliabilityFleetTargeted (bash .ci/reliability
// sets it too): four worlds of a minute each, some with sub-second
// margins (the heartbeat retry's), kept out of the full go test ./...,
// where other packages' tests load the same two cores.
const (
	envFleetBroken   = "JOBREAPER_FLEET_BROKEN"
	envFleetTargeted = "JOBREAPER_FLEET_TARGETED"
)

// fleetScenario is one targeted scenario of the fleet suite: a world in
// which one safety mechanism is the only protection against a false reap
// or a second leader's reap. run drives it to its end; the verdict is
// fleettest.Check's over the recorded history.
type fleetScenario struct {
	name string
	// tag is the test-only build tag that turns the mechanism off
	// (package internal/broken); worker says the worker program needs it
	// too (the heartbeat retry is the worker library's).
	tag    string
	worker bool
	// cluster says the scenario restarts PostgreSQL (a cluster of the
	// test's own).
	cluster bool
	run     func(w *fleetWorld) (end time.Time, stallBound time.Duration)
}

// The timings of the heartbeat retry scenario: a heartbeat interval of
// 4 s (the stall rule's floor is then 2 x 4 s + 1 s = 9 s, under the 10 s
// stall timeout), whose retry after a failed write waits 0.8 s (a fifth
// of the interval), and a cut of 8.6 s from just after the job's last
// write. With the retry, the first write after the cut lands 9.4 s to
// 9.8 s after the last one, inside the stall timeout; without it, the
// write the cut failed at 4 s uses up the interval, the one at 8 s fails
// too, and the next lands 12 s after the last one: 2 s, two passes, past
// the stall timeout. The margins are the stall rule's own (its floor is
// two intervals and a pass), not 10x: a shorter cut shows nothing, a
// longer one is past the stall timeout.
const (
	hbRetryInterval = 4 * time.Second
	hbRetryCut      = 8600 * time.Millisecond
)

// fleetScenarios are the targeted scenarios, each the only place its
// mechanism is tested alone.
var fleetScenarios = []fleetScenario{
	{name: "outage grace", tag: "brokengrace", cluster: true, run: scenarioOutageGrace},
	{name: "storm hold", tag: "brokenstorm", run: scenarioStormHold},
	{name: "heartbeat retry", tag: "brokenhbretry", worker: true, run: scenarioHeartbeatRetry},
	{name: "lease fence", tag: "brokenfence", run: scenarioLeaseFence},
}

// liveJobs enqueues n jobs of the slow kind that heartbeat until a finish
// command, and waits until they are claimed, heartbeating and past
// max_runtime.
func (w *fleetWorld) liveJobs(prefix string, n int) []string {
	w.t.Helper()
	ids := jobIDs(prefix, n)
	w.enqueue(fleetQueue, blipLive, ids, blipJob{Kind: "heartbeat"})
	for _, id := range ids {
		w.kinds[id] = fleettest.KindSlow
	}
	w.waitLive(ids)
	return ids
}

// finish ends the live jobs still running and waits, up to a minute, until
// no job is PROCESSING; it never fails the test (a broken build may have
// reaped them), the checker judges.
func (w *fleetWorld) finish() time.Time {
	w.t.Helper()
	for _, wk := range w.liveWorkers {
		wk.Tell(w.t, "finish all")
	}
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) && w.db.Count(w.t, `SELECT count(*) FROM `+w.db.Table("jobs")+` WHERE status = 'PROCESSING'`) > 0 {
		time.Sleep(200 * time.Millisecond) // polling
	}
	return time.Now()
}

// anyPass waits until one of the live daemons has run a clean pass more
// than when it was called, or a minute passed.
func (w *fleetWorld) anyPass() {
	from := map[*fleettest.Daemon]float64{}
	for _, d := range w.liveDaemons() {
		from[d] = okPasses(d)
	}
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		for d, n := range from {
			if okPasses(d) > n && n >= 0 {
				return
			}
			if n < 0 {
				from[d] = okPasses(d)
			}
		}
		time.Sleep(100 * time.Millisecond) // polling
	}
}

// scenarioOutageGrace: PostgreSQL goes down under everyone for the stall
// timeout plus a heartbeat interval, with 5 live jobs (fewer than the 10 a
// stall storm needs); the workers get it back only after a daemon's first
// pass after the restart (the worst order). Only the outage grace (idle
// counted from the restart) keeps the 5 from being reaped at that pass.
func scenarioOutageGrace(w *fleetWorld) (time.Time, time.Duration) {
	t := w.t
	w.liveJobs("G", 5)
	names := workerNames(w)
	cutAt := time.Now()
	cut(pgRelays(w.liveWorkers...)...)
	w.cluster.Stop(t)
	sleepFor(t.Context(), blipOutage)
	w.cluster.Start(t)
	restartedAt := time.Now()
	w.anyPass()
	restore(pgRelays(w.liveWorkers...)...)
	w.outage(fleettest.FaultPGRestart, cutAt, restartedAt, nil)
	w.outage(fleettest.FaultWorkersCut, cutAt, time.Now(), names)
	sleepFor(t.Context(), blipStall+3*time.Second)
	return w.finish(), blipStall
}

// scenarioStormHold: every worker loses PostgreSQL for the stall timeout
// plus 4 s, with 12 live jobs (at least 10, and every active task): only
// the stall-storm hold keeps them from being reaped during the cut; they
// heartbeat again before the hold ends.
func scenarioStormHold(w *fleetWorld) (time.Time, time.Duration) {
	t := w.t
	w.liveJobs("S", 12)
	names := workerNames(w)
	cutAt := time.Now()
	cut(pgRelays(w.liveWorkers...)...)
	sleepFor(t.Context(), blipStall+4*time.Second)
	restore(pgRelays(w.liveWorkers...)...)
	w.outage(fleettest.FaultWorkersCut, cutAt, time.Now(), names)
	sleepFor(t.Context(), fleetStormHold)
	return w.finish(), blipStall
}

// scenarioHeartbeatRetry: one live job (far from a storm) whose worker
// loses PostgreSQL just after the job's heartbeat landed, for
// hbRetryCut, shorter than the stall timeout: only the Heartbeater's retry
// after a failed write lands its progress before the stall timeout (see
// hbRetryInterval).
func scenarioHeartbeatRetry(w *fleetWorld) (time.Time, time.Duration) {
	t := w.t
	ids := w.liveJobs("H", 1)
	var last time.Time
	if err := w.db.Pool.QueryRow(t.Context(), `SELECT updated_at FROM `+w.db.Table("jobs")+` WHERE id = $1`, ids[0]).Scan(&last); err != nil {
		t.Fatal(err)
	}
	fleettest.WaitFor(t, ids[0]+" heartbeats again", func() bool {
		var now time.Time
		if err := w.db.Pool.QueryRow(t.Context(), `SELECT updated_at FROM `+w.db.Table("jobs")+` WHERE id = $1`, ids[0]).Scan(&now); err != nil {
			t.Fatal(err)
		}
		return now.After(last)
	})
	names := workerNames(w)
	cutAt := time.Now()
	cut(pgRelays(w.liveWorkers...)...)
	sleepFor(t.Context(), hbRetryCut)
	restore(pgRelays(w.liveWorkers...)...)
	// Idle time counts from the cut's end: a reap within the stall
	// timeout after it is a false one.
	w.outage(fleettest.FaultWorkersCut, cutAt, time.Now(), names)
	sleepFor(t.Context(), blipStall)
	return w.finish(), blipStall
}

// scenarioLeaseFence: the leader stops itself (the reap-before-commit
// failpoint) between its reap transaction's leader lease check and its
// COMMIT, holding a stalled job's row; the other daemons take the lease
// over; the stopped one is resumed. Only the lease fence (its check's row
// lock, and the idle bound that ends the stopped session) keeps it from
// committing a reap after another replica took the lease.
func scenarioLeaseFence(w *fleetWorld) (time.Time, time.Duration) {
	t := w.t
	ids := jobIDs("L", 1)
	w.enqueue(fleetQueue, blipLive, ids, blipJob{Kind: "heartbeat", HangAfter: "500ms"})
	w.kinds[ids[0]] = fleettest.KindStalling
	w.failpoints = "reap-before-commit=stop"
	a := w.startDaemon()
	w.failpoints = ""
	a.AwaitLog(t, 0, "failpoint reap-before-commit reached (stop)")
	fleettest.WaitFor(t, "the kernel reports the leader stopped before its COMMIT", func() bool { return processStopped(a.Pid()) })
	stoppedAt := time.Now()
	w.startDaemon()
	w.startDaemon()
	// The other daemons take over within the lease TTL plus the idle
	// bound; a broken fence lets them take it but not the row A holds.
	sleepFor(t.Context(), 4*reaper.LeaderLeaseTTL(blipInterval)+3*time.Second)
	a.Signal(t, syscall.SIGCONT)
	sleepFor(t.Context(), 5*time.Second)
	end := w.finish()
	return end, blipStall + 2*blipInterval + end.Sub(stoppedAt)
}

func workerNames(w *fleetWorld) []string {
	var out []string
	for _, wk := range w.liveWorkers {
		out = append(out, wk.Name)
	}
	return out
}

// runFleetScenario builds the world of s (with the broken binaries of
// tag when tag is set), runs it and returns the checker's violations.
func runFleetScenario(t *testing.T, s fleetScenario, tag string) []string {
	t.Helper()
	var db *jobstest.DB
	var cluster *jobstest.Cluster
	if s.cluster {
		if !haveInitdb() {
			if os.Getenv("CI") != "" {
				t.Fatalf("%s: initdb is not installed, so the test has no PostgreSQL of its own to restart", s.name)
			}
			t.Skipf("%s: initdb is not installed, so the test has no PostgreSQL of its own to restart", s.name)
		}
		cluster = jobstest.StartCluster(t)
		db = clusterDB(t, cluster)
	} else {
		db = jobstest.New(t)
	}
	w := newFleetWorld(t, db, cluster)
	if tag != "" {
		w.bin = fleettest.BuildJobreaperBroken(t, tag)
		if s.worker {
			w.workerBin = fleettest.BuildWorkerBroken(t, tag)
		}
	}
	if s.tag == "brokenhbretry" {
		w.daemonArgs = []string{"--heartbeat-interval", hbRetryInterval.String()}
		w.workerArgs = []string{"--heartbeat-interval", hbRetryInterval.String()}
	}
	if s.tag == "brokenfence" {
		// An operation timeout longer than the stop: the resumed
		// leader's COMMIT must not fail for its own expired context,
		// which would hide a missing fence.
		w.daemonArgs = []string{"--op-timeout", "30s"}
	}
	if s.name != "lease fence" {
		w.startDaemon()
		w.startDaemon()
	}
	w.startWorker()
	w.startWorker()
	end, bound := s.run(w)
	v := w.judge(end, bound)
	t.Logf("%s (build %q): %d reaps judged, %d false, %d violations", s.name, cmpOr(tag, "release"), v.Reaps, v.FalseReaps, len(v.Violations))
	return v.Violations
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// TestReliabilityFleetTargeted runs each targeted scenario
// (fleetScenarios) on the real binaries: each must end with no violation,
// its mechanism being the only protection there. It runs with
// JOBREAPER_FLEET_TARGETED=1 (bash .ci/reliability sets it); in a plain go
// test ./... the blip cases (B47, B48) and the fence case (B45) test the
// same mechanisms with one daemon or two. Not parallel: its margins are in
// seconds.
func TestReliabilityFleetTargeted(t *testing.T) {
	if os.Getenv(envFleetTargeted) == "" {
		t.Skipf("set %s=1 (make reliability does) to run the targeted fleet scenarios", envFleetTargeted)
	}
	for _, s := range fleetScenarios {
		t.Run(strings.ReplaceAll(s.name, " ", "_"), func(t *testing.T) {
			if violations := runFleetScenario(t, s, ""); len(violations) > 0 {
				t.Fatalf("%s: %d violations:\n%s", s.name, len(violations), strings.Join(violations, "\n"))
			}
		})
	}
}

// TestReliabilityFleetBroken builds each deliberately broken copy (one
// safety mechanism off, package internal/broken) and shows that its
// targeted scenario fails: the checker finds a violation. It runs with
// JOBREAPER_FLEET_BROKEN=1 (bash .ci/reliability sets it), not in a plain
// go test ./...: four more builds and worlds take minutes.
func TestReliabilityFleetBroken(t *testing.T) {
	if os.Getenv(envFleetBroken) == "" {
		t.Skipf("set %s=1 (make reliability does) to build the broken copies and run their scenarios", envFleetBroken)
	}
	for _, s := range fleetScenarios {
		t.Run(s.tag, func(t *testing.T) {
			violations := runFleetScenario(t, s, s.tag)
			if len(violations) == 0 {
				t.Fatalf("%s with %s: the checker found nothing; the scenario does not test the mechanism", s.name, s.tag)
			}
			t.Logf("%s with %s: caught by %d violations, first: %s", s.name, s.tag, len(violations), violations[0])
			jobstest.Figure(t, fleetSuite, "broken_caught_"+s.tag, len(violations))
		})
	}
}
