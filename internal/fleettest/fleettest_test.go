package fleettest_test

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/jobreaper/jobreaper/internal/fleettest"
	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
	"github.com/jobreaper/jobreaper/queue"
	"github.com/jobreaper/jobreaper/queue/queuetest"
	"github.com/jobreaper/jobreaper/queue/redistest"
)

// The harness end to end: a daemon and a worker process, each through its
// own relays, on a schema and a redis-server of the test's own. Three
// jobs, each run longer than its type's max_runtime (1 s) by the worker:
// one completes at once, one heartbeats every 200 ms for 6 s (twice the
// stall timeout) and then completes, one hangs. The daemon reaps the
// hanging one only, and its cancel on reap ends that handler's context;
// the heartbeating one completes unreaped.
func TestHarnessDaemonAndWorker(t *testing.T) {
	t.Parallel()
	db := jobstest.New(t)
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	const q = "harness"
	db.JobType(t, "harness.job", "1 second", "3 seconds", "")
	d := fleettest.StartDaemon(t, fleettest.BuildJobreaper(t), fleettest.DaemonOptions{Name: "daemon",
		DatabaseURL: db.URL, RedisURL: srv.URL,
		Args: []string{"--schema", db.Schema, "--queues", q, "--interval", "1s", "--stall-timeout", "3s", "--heartbeat-interval", "1s"}})
	w := fleettest.StartWorker(t, fleettest.BuildWorker(t), fleettest.WorkerOptions{Name: "w1",
		DatabaseURL: db.URL, Schema: db.Schema, RedisURL: srv.URL, Queue: q, Args: []string{"--heartbeat-interval", "1s"}})

	store, client := db.Store(), asynq.NewClientFromRedisClient(rdb)
	enqueue := func(id string, p map[string]string) {
		t.Helper()
		db.Insert(t, jobstest.Job{ID: id, Type: "harness.job", Status: jobs.StatusQueued, Queue: q})
		raw, err := json.Marshal(p)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := queue.Enqueue(t.Context(), client, store, asynq.NewTask("harness.job", raw), id); err != nil {
			t.Fatalf("enqueueing %s: %v", id, err)
		}
	}
	enqueue("J-complete", map[string]string{"kind": "complete"})
	enqueue("J-beat", map[string]string{"kind": "heartbeat", "heartbeat_every": "200ms", "run_for": "6s"})
	enqueue("J-hang", map[string]string{"kind": "hang"})

	w.Await(t, "completed J-complete generation 1")
	w.Await(t, "returned J-hang generation 1: context canceled")
	if row := db.Read(t, "J-hang"); row.Status != jobs.StatusFailed || row.FailureReason != jobs.ReasonStalled {
		t.Fatalf("J-hang = %+v, want FAILED stalled", row)
	}
	w.Await(t, "completed J-beat generation 1")
	if row := db.Read(t, "J-beat"); row.Status != jobs.StatusCompleted {
		t.Fatalf("J-beat = %+v, want COMPLETED (its heartbeats kept it alive)", row)
	}
	if n := d.Metric("jobreaper_jobs_reaped_total", `reason="stalled"`); n != 1 {
		t.Fatalf("the daemon reaped %v jobs, want 1", n)
	}
	if code := w.Stop(t); code != 0 {
		t.Fatalf("the worker's exit after SIGTERM: %d", code)
	}
	if code := d.Stop(t); code != 0 {
		t.Fatalf("the daemon's exit after SIGTERM: %d", code)
	}
}

// A relay cut takes its server away from its process only: the daemon's
// /readyz names PostgreSQL while its relay is cut, and answers 200 again
// once it is restored.
func TestHarnessRelayCutAndRestore(t *testing.T) {
	t.Parallel()
	db := jobstest.New(t)
	srv := redistest.Start(t)
	d := fleettest.StartDaemon(t, fleettest.BuildJobreaper(t), fleettest.DaemonOptions{DatabaseURL: db.URL, RedisURL: srv.URL,
		Args: []string{"--schema", db.Schema, "--queues", "relay", "--interval", "1s", "--stall-timeout", "11m", "--op-timeout", "2s"}})
	d.PG.Cut()
	var body string
	fleettest.WaitFor(t, "/readyz answers 503", func() bool {
		var code int
		code, body = d.Probe("/readyz")
		return code == 503
	})
	if !strings.Contains(body, "postgresql check failed") {
		t.Fatalf("/readyz body %q does not name PostgreSQL", body)
	}
	d.PG.Restore()
	fleettest.WaitFor(t, "/readyz answers 200 again", func() bool {
		code, _ := d.Probe("/readyz")
		return code == 200
	})
}

// The stop failpoint at reap-before-commit stops the daemon's process in
// its reap transaction, after the leader lease check and before COMMIT:
// the kernel reports the process stopped, and the stalled job is still
// PROCESSING with no reaped event (nothing committed). SIGCONT resumes it
// there, and the reap commits.
func TestHarnessStopFailpointBeforeTheReapCommits(t *testing.T) {
	t.Parallel()
	db := jobstest.New(t)
	db.JobType(t, "report.export", "30 minutes", "", "")
	srv := redistest.Start(t)
	const q = "stop"
	db.Insert(t, jobstest.Job{ID: "J-stop", Type: "report.export", Generation: 1, Queue: q, Worker: "w1",
		StartedAgo: jobstest.Ago(31 * time.Minute), IdleAgo: 21 * time.Minute})
	if err := queuetest.MakeActive(t.Context(), srv.Client(t), q, "report.export", []string{"J-stop"}); err != nil {
		t.Fatal(err)
	}
	d := fleettest.StartDaemon(t, fleettest.BuildJobreaper(t), fleettest.DaemonOptions{DatabaseURL: db.URL, RedisURL: srv.URL,
		Failpoints: "reap-before-commit=stop", Args: []string{"--schema", db.Schema, "--queues", q, "--interval", "1s", "--stall-timeout", "11m"}})
	d.AwaitLog(t, 0, "failpoint reap-before-commit reached (stop)")
	fleettest.WaitFor(t, "the kernel reports the process stopped", func() bool {
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", d.Pid()))
		// The state follows the command name in parentheses: "pid (comm) T ...".
		_, after, ok := strings.Cut(string(stat), ") ")
		return err == nil && ok && strings.HasPrefix(after, "T")
	})
	if row := db.Read(t, "J-stop"); row.Status != jobs.StatusProcessing || db.Events(t, "J-stop", "reaped") != 0 {
		t.Fatalf("J-stop = %+v with %d reaped events while its reap waits before COMMIT, want PROCESSING and none",
			row, db.Events(t, "J-stop", "reaped"))
	}
	d.Signal(t, syscall.SIGCONT)
	fleettest.WaitFor(t, "the resumed reap commits", func() bool { return db.Read(t, "J-stop").Status == jobs.StatusFailed })
}
