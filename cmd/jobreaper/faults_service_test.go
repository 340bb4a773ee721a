package main

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/jobreaper/jobreaper/internal/fleettest"
	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
	"github.com/jobreaper/jobreaper/queue/redistest"
)

// faultQueue is the queue of the fault tests' stalled jobs; each test has
// its own Redis, so the name need not be unique.
const faultQueue = "faults"

// serviceFault is a dependency a test takes away from a running daemon
// and brings back.
type serviceFault struct {
	// figure names the count of faults injected (pg_cut, redis_stop).
	figure string
	// down takes the service away, up brings it back.
	down, up func()
}

// startFaultDaemon runs `jobreaper run` in-process on the fixture's schema
// with a pass every second. Every pass re-asserts every marker of the last
// 7 days (--marker-check-window equal to --interval), so that a marker is
// due after the next good pass whatever the fault did to its first write.
// The leader lease and cancel on reap are on, as in a sidecar, and a live
// asynq server serves a queue of the daemon's (serveLiveQueue), as the
// workers a sidecar runs beside do.
func startFaultDaemon(t *testing.T, f *faultFixture, rdb redis.UniversalClient, databaseURL, redisURL string) *daemon {
	t.Helper()
	serveLiveQueue(t, rdb)
	d := startDaemon(t, "--database-url", databaseURL, "--schema", f.db.Schema, "--redis-url", redisURL,
		"--queues", faultQueues, "--config", f.config, "--interval", "1s", "--marker-check-window", "1s",
		"--stall-timeout", "11m", "--op-timeout", "2s")
	logTailOnFailure(t, d.stderr)
	return d
}

// runServiceFaults runs rounds of: faultJobsPerRound stalled jobs added,
// the service taken away at a random point of the daemon's work on them
// (either a random delay after they became active, or a random delay after
// the daemon's first committed reap of the round, so that the fault falls
// among its reap transactions and marker writes), brought back after a
// random outage of 0.1 to 1 s; then, polling with a deadline: a clean pass
// after the service came back, every job of the round reaped, two more
// clean passes, and the checks (no half-written reap anywhere in the
// schema, every reaped job's marker, no job row lost). It records the
// figures.
func runServiceFaults(t *testing.T, rng *rand.Rand, f *faultFixture, rdb redis.UniversalClient, d *daemon, fault serviceFault) {
	t.Helper()
	rounds := faultServiceRounds(t)
	injected, violations, lost := 0, 0, 0
	defer func() {
		jobstest.Figure(t, faultSuite, fault.figure, injected)
		jobstest.Figure(t, faultSuite, "violations", violations)
		jobstest.Figure(t, faultSuite, "rows_lost", lost)
	}()
	for round := 1; round <= rounds; round++ {
		prefix := fmt.Sprintf("%s%02d", fault.figure, round)
		like := f.addStalled(t, rdb, faultQueue, prefix, faultJobsPerRound)
		var point string
		if rng.IntN(2) == 0 {
			waitUntil(t, faultWait, "the daemon's first reap of round "+prefix, func() bool { return f.count(t, like, jobs.StatusFailed) > 0 })
			delay := between(rng, 0, 50*time.Millisecond)
			time.Sleep(delay) // the random point: how far into the reaps the fault falls
			point = fmt.Sprintf("%s after the first committed reap", delay.Round(time.Millisecond))
		} else {
			delay := between(rng, 0, 1500*time.Millisecond)
			time.Sleep(delay) // the random point: about a pass interval plus a pass
			point = fmt.Sprintf("%s after the jobs became active", delay.Round(time.Millisecond))
		}
		reapedAtFault := f.count(t, like, jobs.StatusFailed)
		before := d.passes(t)
		fault.down()
		injected++
		outage := between(rng, 100*time.Millisecond, time.Second)
		time.Sleep(outage) // the outage itself, not a wait for an effect
		during := d.passes(t)
		fault.up()
		back := time.Now()
		waitUntil(t, faultWait, "a clean pass after "+fault.figure+" ended", func() bool { return d.passes(t)["ok"] > during["ok"] })
		recovered := time.Since(back)
		waitUntil(t, faultWait, "every job of round "+prefix+" is reaped", func() bool {
			return f.count(t, like, jobs.StatusFailed) == faultJobsPerRound
		})
		// Two clean passes that began after the last reap: the second
		// re-asserted every marker.
		ok := d.passes(t)["ok"]
		waitUntil(t, faultWait, "two clean passes after the round's reaps", func() bool { return d.passes(t)["ok"] >= ok+2 })
		after := d.passes(t)
		t.Logf("round %d: %s at %s (%d of %d jobs reaped then), outage %s; passes since the fault: ok %d, errors %d, failed %d, cancelled %d; "+
			"first clean pass %s after the service came back",
			round, fault.figure, point, reapedAtFault, faultJobsPerRound, outage.Round(time.Millisecond),
			after["ok"]-before["ok"], after["errors"]-before["errors"], after["failed"]-before["failed"], after["cancelled"]-before["cancelled"], recovered.Round(time.Millisecond))
		what := fmt.Sprintf("%s round %d", fault.figure, round)
		violations += f.checkReaps(t, what) + f.checkMarkers(t, rdb, like, what)
		// Every pass that was not interrupted accounted for each task it
		// scanned (the daemon logs an ERROR otherwise).
		requireNoScanMismatch(t, d.stderr.String())
		if n := f.lost(t, like, faultJobsPerRound); n != 0 {
			t.Errorf("after %s: %d job rows lost", what, n)
			lost += n
		}
	}
}

// PostgreSQL goes away in the middle of the daemon's passes: a relay of
// the test's own between the daemon and the shared server drops every
// connection at a random point and refuses new ones for a random outage.
// Each time the daemon comes back by itself, reaps what was left, and no
// reap is half-written.
func TestReliabilityFaults_PostgreSQLConnectionsCutMidPass(t *testing.T) {
	t.Parallel()
	rng := faultRand(t)
	f := newFaultFixture(t)
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	relay, url := fleettest.RelayURL(t, f.db.URL)
	d := startFaultDaemon(t, f, rdb, url, srv.URL)
	runServiceFaults(t, rng, f, rdb, d, serviceFault{figure: "pg_cut", down: relay.Cut, up: relay.Restore})
}

// Redis stops in the middle of the daemon's passes (a redis-server of the
// test's own, shut down with SHUTDOWN SAVE and started again on the same
// port with its data) at a random point and for a random outage. Each
// time the daemon comes back by itself, reaps what was left, every reaped
// job has its marker after the next good pass, and no reap is
// half-written.
func TestReliabilityFaults_RedisStoppedMidPass(t *testing.T) {
	t.Parallel()
	rng := faultRand(t)
	f := newFaultFixture(t)
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	d := startFaultDaemon(t, f, rdb, f.db.URL, srv.URL)
	runServiceFaults(t, rng, f, rdb, d, serviceFault{figure: "redis_stop",
		down: func() { srv.Stop(t) }, up: func() { srv.Restart(t) }})
}
