package main

import (
	"context"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jobreaper/jobreaper/internal/fleettest"
	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
	"github.com/jobreaper/jobreaper/queue"
)

// Two daemons of the real binary on one database and queue set: only one
// runs passes. SIGSTOP the leader: the other leads, within two intervals
// of the last renewal (polled with room for a slow machine, never
// timed). SIGCONT the old one: it starts no reap and no pass until it
// holds the leader lease again, while the new leader reaps. A clean exit
// releases the leader lease, and the other takes over.
func TestLeaderLeaseOneReplicaRunsPasses(t *testing.T) {
	t.Parallel()
	bin := fleettest.BuildJobreaper(t)
	db := jobstest.New(t)
	q := unique("fleet")
	opts := func(name string) fleettest.DaemonOptions {
		return fleettest.DaemonOptions{Name: name, DatabaseURL: db.URL, RedisURL: redisTestURL(),
			Args: []string{"--schema", db.Schema, "--queues", q, "--interval", "2s", "--stall-timeout", "11m"}}
	}
	passes := func(d *fleettest.Daemon) float64 { return d.Metric("jobreaper_passes_total") }
	okPasses := func(d *fleettest.Daemon) float64 { return d.Metric("jobreaper_passes_total", `outcome="ok"`) }
	a := fleettest.StartDaemon(t, bin, opts("replica A"))
	fleettest.WaitFor(t, "A leads", a.Leads)
	b := fleettest.StartDaemon(t, bin, opts("replica B"))
	fleettest.WaitFor(t, "A ran three passes while B was up", func() bool {
		return okPasses(a) >= 3 && b.Metric("jobreaper_leader") == 0
	})
	if n := passes(b); n != 0 {
		t.Fatalf("B, a follower, ran %v passes", n)
	}
	// A follower is ready: it could run passes.
	if code, _ := b.Probe("/readyz"); code != http.StatusOK {
		t.Fatalf("the follower's /readyz = %d, want 200", code)
	}

	a.Signal(t, syscall.SIGSTOP)
	fleettest.WaitFor(t, "B leads once A stopped renewing", b.Leads)
	db.JobType(t, "report.export", "30 minutes", "", "")
	id := unique("J-fleet")
	rdb := realRedis(t)
	t.Cleanup(func() { rdb.Del(context.Background(), queue.MarkerKey(id)) })
	db.Insert(t, jobstest.Job{ID: id, Type: "report.export", Generation: 1, Queue: q,
		StartedAgo: jobstest.Ago(31 * time.Minute), IdleAgo: 21 * time.Minute})
	activeTask(t, id, q)
	fleettest.WaitFor(t, "B reaps the stalled job", func() bool { return db.Read(t, id).Status == jobs.StatusFailed })

	resumedAt := a.Log.Len()
	a.Signal(t, syscall.SIGCONT)
	fleettest.WaitFor(t, "A, resumed, reports it does not lead", func() bool { return a.Metric("jobreaper_leader") == 0 })
	aPasses, bPasses := passes(a), okPasses(b)
	fleettest.WaitFor(t, "B ran three more passes", func() bool { return okPasses(b) >= bPasses+3 })
	if n := passes(a); n != aPasses {
		t.Fatalf("A ran passes after it was resumed without the leader lease: %v -> %v", aPasses, n)
	}
	if since := a.Log.Since(resumedAt); strings.Contains(since, "job reaped") {
		t.Fatalf("A reaped after it was resumed:\n%s", since)
	}
	if db.Events(t, id, "reaped") != 1 {
		t.Fatalf("the job has %d reaped events, want 1", db.Events(t, id, "reaped"))
	}

	// B exits cleanly and releases the leader lease; A takes it.
	if code := b.Stop(t); code != 0 {
		t.Fatalf("B's exit after SIGTERM: %d, want 0", code)
	}
	if !strings.Contains(b.Log.String(), "leader lease released") {
		t.Fatalf("B did not release its leader lease:\n%s", b.Log.String())
	}
	fleettest.WaitFor(t, "A leads again", a.Leads)
}

// Two daemons with different queue sets each lead their own set.
func TestLeaderLeaseEachQueueSetHasItsLeader(t *testing.T) {
	t.Parallel()
	bin := fleettest.BuildJobreaper(t)
	db := jobstest.New(t)
	opts := func(name, q string) fleettest.DaemonOptions {
		return fleettest.DaemonOptions{Name: name, DatabaseURL: db.URL, RedisURL: redisTestURL(),
			Args: []string{"--schema", db.Schema, "--queues", q, "--interval", "2s", "--stall-timeout", "11m"}}
	}
	a := fleettest.StartDaemon(t, bin, opts("replica A", unique("setA")))
	b := fleettest.StartDaemon(t, bin, opts("replica B", unique("setB")))
	fleettest.WaitFor(t, "both lead and run passes", func() bool {
		return a.Leads() && b.Leads() &&
			a.Metric("jobreaper_passes_total", `outcome="ok"`) >= 2 && b.Metric("jobreaper_passes_total", `outcome="ok"`) >= 2
	})
	if n := db.Count(t, `SELECT count(*) FROM `+db.Table("leader_leases")); n != 2 {
		t.Fatalf("%d leader lease rows, want one per queue set", n)
	}
}
