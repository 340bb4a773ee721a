package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jobreaper/jobreaper/internal/fleettest"
	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
	"github.com/jobreaper/jobreaper/queue"
)

// processStopped reports whether the kernel shows pid stopped (SIGSTOP):
// the state follows the command name in /proc/<pid>/stat, "pid (comm) T ...".
func processStopped(pid int) bool {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	_, after, ok := strings.Cut(string(stat), ") ")
	return err == nil && ok && strings.HasPrefix(after, "T")
}

// Case B45 with two real daemons: the leader A is stopped (SIGSTOP, by
// the test-only failpoint) inside its reap transaction, after its leader
// lease check and before COMMIT, holding the lease row FOR SHARE. B takes
// the leader lease within the lease TTL plus the reap transaction's idle
// bound (PostgreSQL ends A's idle session) and reaps the job. Resumed, A
// commits nothing: the job has exactly one reaped event, B's.
func TestCase_B45_TwoDaemonsALeaderStoppedBeforeItsCommit(t *testing.T) {
	t.Parallel()
	bin := fleettest.BuildJobreaper(t)
	db := jobstest.New(t)
	db.JobType(t, "report.export", "30 minutes", "", "")
	q := unique("fence")
	id := unique("J45")
	rdb := realRedis(t)
	t.Cleanup(func() { rdb.Del(context.Background(), queue.MarkerKey(id)) })
	db.Insert(t, jobstest.Job{ID: id, Type: "report.export", Generation: 1, Queue: q, Worker: "W1",
		StartedAgo: jobstest.Ago(31 * time.Minute), IdleAgo: 21 * time.Minute})
	activeTask(t, id, q)
	opts := func(name, failpoints string) fleettest.DaemonOptions {
		return fleettest.DaemonOptions{Name: name, DatabaseURL: db.URL, RedisURL: redisTestURL(), Failpoints: failpoints,
			Args: []string{"--schema", db.Schema, "--queues", q, "--interval", "1s", "--stall-timeout", "11m"}}
	}

	a := fleettest.StartDaemon(t, bin, opts("replica A", "reap-before-commit=stop"))
	a.AwaitLog(t, 0, "failpoint reap-before-commit reached (stop)")
	fleettest.WaitFor(t, "the kernel reports A stopped before its COMMIT", func() bool { return processStopped(a.Pid()) })
	if row := db.Read(t, id); row.Status != jobs.StatusProcessing {
		t.Fatalf("%s is %s while A's reap waits before COMMIT, want PROCESSING", id, row.Status)
	}

	b := fleettest.StartDaemon(t, bin, opts("replica B", ""))
	fleettest.WaitFor(t, "B leads once A's lease lapsed and PostgreSQL ended A's idle transaction", b.Leads)
	fleettest.WaitFor(t, "B reaps the job", func() bool { return db.Read(t, id).Status == jobs.StatusFailed })
	if !strings.Contains(b.Log.String(), "job reaped") {
		t.Fatalf("B did not log the reap:\n%s", b.Log.String())
	}

	resumedAt := a.Log.Len()
	a.Signal(t, syscall.SIGCONT)
	fleettest.WaitFor(t, "A, resumed, reports its reap rolled back", func() bool {
		since := a.Log.Since(resumedAt)
		return strings.Contains(since, "reap rolled back") || strings.Contains(since, "reap of a batch failed")
	})
	if since := a.Log.Since(resumedAt); strings.Contains(since, "job reaped") {
		t.Fatalf("A reaped after B held the leader lease:\n%s", since)
	}
	if n := db.Events(t, id, "reaped"); n != 1 {
		t.Fatalf("%s has %d reaped events, want 1 (B's)", id, n)
	}
}
