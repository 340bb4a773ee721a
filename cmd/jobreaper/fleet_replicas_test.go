package main

import (
	"strings"
	"testing"
	"time"

	"github.com/jobreaper/jobreaper/internal/asynqstate"
	"github.com/jobreaper/jobreaper/internal/fleettest"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
)

// Two daemons of the real binary; the leader A reaches PostgreSQL through
// a relay of its own, which is cut. A's /metrics says 0 from its
// first failed renewal and its lease age keeps growing; once B took the
// leader lease, every scrape finds exactly one replica exporting 1.
func TestLeaderMetricsOfAReplicaCutOffFromPostgreSQL(t *testing.T) {
	t.Parallel()
	bin := fleettest.BuildJobreaper(t)
	db := jobstest.New(t)
	const interval = 2 * time.Second
	q := unique("cutoff")
	opts := func(name string) fleettest.DaemonOptions {
		return fleettest.DaemonOptions{Name: name, DatabaseURL: db.URL, RedisURL: redisTestURL(),
			Args: []string{"--schema", db.Schema, "--queues", q, "--interval", interval.String(), "--stall-timeout", "11m"}}
	}
	a := fleettest.StartDaemon(t, bin, opts("replica A"))
	fleettest.WaitFor(t, "A leads", a.Leads)
	b := fleettest.StartDaemon(t, bin, opts("replica B"))
	fleettest.WaitFor(t, "B follows, having read A's renewals", func() bool {
		return b.Metric("jobreaper_leader") == 0 && b.Metric("jobreaper_leader_lease_age_seconds") > 0 &&
			b.Metric("jobreaper_leader_lease_age_seconds") < interval.Seconds()
	})

	failedAt := a.Log.Len()
	a.PG.Cut()
	fleettest.WaitFor(t, "A's first renewal fails", func() bool {
		return strings.Contains(a.Log.Since(failedAt), "leader lease attempt failed")
	})
	if v := a.Metric("jobreaper_leader"); v != 0 {
		t.Fatalf("A exports jobreaper_leader %v after its first failed renewal, want 0", v)
	}
	first := a.Metric("jobreaper_leader_lease_age_seconds")
	fleettest.WaitFor(t, "A's lease age grows past two intervals", func() bool {
		return a.Metric("jobreaper_leader_lease_age_seconds") > 2*interval.Seconds()
	})
	if later := a.Metric("jobreaper_leader_lease_age_seconds"); later <= first {
		t.Fatalf("A's lease age went from %v to %v while it could not renew", first, later)
	}

	fleettest.WaitFor(t, "B leads", b.Leads)
	for range 20 {
		la, lb := a.Metric("jobreaper_leader"), b.Metric("jobreaper_leader")
		if la != 0 || lb != 1 {
			t.Fatalf("after the takeover A exports jobreaper_leader %v and B %v, want 0 and 1", la, lb)
		}
		if age := b.Metric("jobreaper_leader_lease_age_seconds"); age > interval.Seconds() {
			t.Fatalf("the new leader's lease age is %vs, want under one interval", age)
		}
		time.Sleep(150 * time.Millisecond)
	}
	if age := a.Metric("jobreaper_leader_lease_age_seconds"); age <= 2*interval.Seconds() {
		t.Fatalf("A's lease age fell to %vs while it still cannot reach PostgreSQL", age)
	}
}

// A replica of the real binary deployed with another Redis database, a
// lost-task limit and cancel on reap off reports each as settings drift
// against the leader, naming both values, once for as long as the
// difference stays the same.
func TestSettingsDriftOfTheBinaryNamesTheRedisItReads(t *testing.T) {
	t.Parallel()
	bin := fleettest.BuildJobreaper(t)
	db := jobstest.New(t)
	common := []string{"--database-url", db.URL, "--schema", db.Schema, "--queues", unique("drift"),
		"--interval", "2s", "--stall-timeout", "11m"}
	otherRedis := strings.TrimSuffix(redisTestURL(), "/"+redisTestDB) + "/11"
	a := fleettest.StartDaemon(t, bin, fleettest.DaemonOptions{Name: "replica A", Args: append(common, "--redis-url", redisTestURL())})
	fleettest.WaitFor(t, "A leads", a.Leads)
	b := fleettest.StartDaemon(t, bin, fleettest.DaemonOptions{Name: "replica B", Args: append(common, "--redis-url", otherRedis,
		"--max-lost-per-pass", "5", "--cancel-on-reap=false")})
	fleettest.WaitFor(t, "B reports settings drift", func() bool { return b.Metric("jobreaper_settings_drift") == 1 })
	passes := a.Metric("jobreaper_passes_total")
	fleettest.WaitFor(t, "A ran three more passes (B made several attempts)", func() bool {
		return a.Metric("jobreaper_passes_total") >= passes+3
	})
	if b.Metric("jobreaper_settings_drift") != 1 || a.Metric("jobreaper_settings_drift") != 0 {
		t.Fatal("jobreaper_settings_drift is not 1 on B and 0 on A while the drift lasts")
	}
	mine, err := asynqstate.RedisID(otherRedis)
	if err != nil {
		t.Fatal(err)
	}
	leaders, err := asynqstate.RedisID(redisTestURL())
	if err != nil {
		t.Fatal(err)
	}
	var drifts []string
	for _, line := range strings.Split(b.Log.String(), "\n") {
		if strings.Contains(line, "level=ERROR") && strings.Contains(line, "settings drift") {
			drifts = append(drifts, line)
		}
	}
	if len(drifts) != 1 {
		t.Fatalf("B logged the drift %d times, want once:\n%s", len(drifts), strings.Join(drifts, "\n"))
	}
	for _, want := range []string{
		"redis: this replica " + mine + ", the leader " + leaders,
		"max_lost_per_pass: this replica 5, the leader 100",
		"cancel_on_reap: this replica false, the leader true",
	} {
		if !strings.Contains(drifts[0], want) {
			t.Errorf("B's drift line does not say %q:\n%s", want, drifts[0])
		}
	}
}
