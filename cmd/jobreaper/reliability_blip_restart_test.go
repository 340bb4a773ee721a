package main

import (
	"context"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/jobreaper/jobreaper/internal/fleettest"
	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
)

// envRestartDowntime sets how long PostgreSQL stays down in
// TestReliabilityBlip_ARestartWhileTheDaemonWasDown (a Go duration,
// default blipOutage; at least that).
const envRestartDowntime = "JOBREAPER_RESTART_DOWNTIME"

// restartDowntime returns JOBREAPER_RESTART_DOWNTIME or blipOutage.
func restartDowntime(t *testing.T) time.Duration {
	t.Helper()
	s := os.Getenv(envRestartDowntime)
	if s == "" {
		return blipOutage
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < blipOutage {
		t.Fatalf("%s=%q: want a Go duration of at least %s (the stall timeout plus one heartbeat interval)", envRestartDowntime, s, blipOutage)
	}
	return d
}

// clusterDB returns a jobstest.DB over schema jobreaper of the test's own
// PostgreSQL cluster, migrated.
func clusterDB(t *testing.T, c *jobstest.Cluster) *jobstest.DB {
	t.Helper()
	const schema = "jobreaper"
	url := c.URL + "&search_path=" + schema
	pool, err := jobs.Connect(t.Context(), url, schema)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if _, err := jobs.Migrate(t.Context(), pool, schema); err != nil {
		t.Fatal(err)
	}
	return &jobstest.DB{Pool: pool, Schema: schema, URL: url}
}

// TestReliabilityBlip_ARestartWhileTheDaemonWasDown is case B47's restart
// with real processes: 20 live jobs past max_runtime, heartbeating every
// 200 ms from two worker processes, on a PostgreSQL cluster the test
// started itself; the daemon runs passes, then stops; the workers lose
// PostgreSQL (their relays cut), and the cluster goes down for the stall
// timeout plus one heartbeat interval (JOBREAPER_RESTART_DOWNTIME) and
// starts again, a downtime that alone makes every live job look stalled.
// A daemon started after it has seen no lost connection, yet its first
// pass finds the later postmaster start and records it as the outage end
// (cause restart), holding every job as outage_grace; the workers get
// PostgreSQL back only after that pass (the worst order). No live job is
// reaped, through the grace and after it, and they complete. The control:
// a daemon with the outage grace off (--outage-grace=false), of 5 other
// live jobs (too few for a stall storm), stopped and started likewise,
// reaps all 5 at its first pass after the restart.
//
// Figures: the downtime, the live jobs, and live jobs reaped (must be 0).
// Not parallel: its margins are in seconds.
func TestReliabilityBlip_ARestartWhileTheDaemonWasDown(t *testing.T) {
	downtime := restartDowntime(t)
	cluster := jobstest.StartCluster(t)
	db := clusterDB(t, cluster)
	f := newBlipFleet(t, db)
	const q, qOff = "restart", "restart-off"
	live, off := jobIDs("J-live", 20), jobIDs("J-off", 5)
	ws := []*fleettest.Worker{f.worker("w1", q+","+qOff, 20), f.worker("w2", q+","+qOff, 20)}
	f.enqueue(q, blipLive, live, blipJob{Kind: "heartbeat"})
	f.enqueue(qOff, blipLive, off, blipJob{Kind: "heartbeat"})
	f.waitLive(slices.Concat(live, off))

	before, beforeOff := f.daemon("the daemon", q), f.daemon("the grace-off daemon", qOff, "--outage-grace=false")
	waitPasses(t, before, 0, 2)
	waitPasses(t, beforeOff, 0, 2)
	for _, d := range []*fleettest.Daemon{before, beforeOff} {
		if code := d.Stop(t); code != 0 {
			t.Fatalf("%s's exit after SIGTERM: %d", d.Name, code)
		}
	}
	f.requireNoneReaped("before the restart", slices.Concat(live, off))

	// The daemons are down; the workers lose PostgreSQL, which goes down
	// and comes back.
	cut(pgRelays(ws...)...)
	stoppedAt := time.Now()
	cluster.Stop(t)
	sleepFor(t.Context(), downtime)
	cluster.Start(t)
	t.Logf("PostgreSQL down for %s", time.Since(stoppedAt).Round(time.Millisecond))
	after, afterOff := f.daemon("the daemon after the restart", q), f.daemon("the grace-off daemon after the restart", qOff, "--outage-grace=false")
	waitPasses(t, after, 0, 1)
	waitPasses(t, afterOff, 0, 1)
	restore(pgRelays(ws...)...)

	var started time.Time
	if err := db.Pool.QueryRow(context.WithoutCancel(t.Context()), `SELECT pg_postmaster_start_time()`).Scan(&started); err != nil {
		t.Fatal(err)
	}
	end, cause := f.outageRow()
	if cause != "restart" || !end.Equal(started) {
		t.Fatalf("outage end %s (%s), want the restart at %s", end, cause, started)
	}
	fleettest.WaitFor(t, "the daemon's first pass after the restart holds its live jobs as outage_grace", func() bool {
		return graceHeld(after) >= float64(len(live))
	})
	f.requireNoneReaped("the first pass after the restart", live)
	fleettest.WaitFor(t, "the grace-off daemon reaps its 5 live jobs", func() bool { return f.reapedStalled(off) == len(off) })
	t.Logf("the control: the grace-off daemon reaped its 5 live jobs in passes of %v", f.reapPasses(off))

	fleettest.WaitFor(t, "every live job heartbeats after the restart", func() bool {
		return f.count(live, `updated_at > $2`, started) == len(live)
	})
	fleettest.WaitFor(t, "the grace is over", func() bool { return f.now().After(end.Add(blipStall)) })
	waitPasses(t, after, okPasses(after), 2)
	liveReaped := len(f.changed(live))
	jobstest.Figure(t, blipSuite, "restart_downtime_s", int(downtime.Seconds()))
	jobstest.Figure(t, blipSuite, "restart_live_jobs", len(live))
	jobstest.Figure(t, blipSuite, "live_reaped", liveReaped)
	f.requireNoneReaped("a restart while the daemon was down", live)
	if n := after.Metric("jobreaper_jobs_reaped_total"); n != 0 {
		t.Fatalf("the daemon reaped %v jobs after the restart, want 0", n)
	}
	t.Logf("the daemon's passes after the restart held %v jobs as outage_grace", graceHeld(after))

	if n := f.tell("finish all"); n != len(live) {
		t.Fatalf("finish all reached %d handlers, want %d", n, len(live))
	}
	fleettest.WaitFor(t, "the live jobs complete", func() bool { return f.count(live, `status = 'COMPLETED'`) == len(live) })
}
