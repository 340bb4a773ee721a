package main

import (
	"context"
	"io"
	"net/http"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
	"github.com/jobreaper/jobreaper/queue"
)

// fleetDeadline bounds every wait of the fleet tests: they poll, and a
// slow CI machine (two cores, -race elsewhere) gets plenty of room.
const fleetDeadline = 90 * time.Second

// waitFor polls cond every 100 ms until it holds, failing the test after
// fleetDeadline.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(fleetDeadline)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting until %s", fleetDeadline, what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// replica is one `jobreaper run` process of the real binary.
type replica struct {
	name   string
	cmd    *exec.Cmd
	stderr *jobstest.SyncBuffer
	addr   string
}

// startReplica starts the binary as a daemon with args and waits until
// its metrics server listens. It is killed at cleanup if still running.
func startReplica(t *testing.T, bin, name string, args ...string) *replica {
	t.Helper()
	r := &replica{name: name, stderr: &jobstest.SyncBuffer{}}
	r.cmd = exec.Command(bin, append([]string{"run", "--metrics-addr", "127.0.0.1:0", "--start-jitter", "0s"}, args...)...)
	r.cmd.Stderr = r.stderr
	if err := r.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = r.cmd.Process.Signal(syscall.SIGCONT)
		_ = r.cmd.Process.Kill()
		_ = r.cmd.Wait()
		t.Logf("%s's log:\n%s", r.name, r.stderr.String())
	})
	addrRE := regexp.MustCompile(`serving /metrics and /healthz" component=metrics addr=(\S+)`)
	waitFor(t, name+"'s metrics server listens", func() bool {
		if m := addrRE.FindStringSubmatch(r.stderr.String()); m != nil {
			r.addr = m[1]
		}
		return r.addr != ""
	})
	return r
}

// metric returns the sum of the series of name whose label text contains
// every fragment (`outcome="ok"`), from one scrape; -1 when the scrape
// failed (a stopped process).
func (r *replica) metric(t *testing.T, name string, fragments ...string) float64 {
	t.Helper()
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 2 * time.Second}
	resp, err := client.Get("http://" + r.addr + "/metrics")
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	sum := 0.0
lines:
	for _, line := range strings.Split(string(body), "\n") {
		series, value, ok := strings.Cut(line, " ")
		if !ok || (series != name && !strings.HasPrefix(series, name+"{")) {
			continue
		}
		for _, f := range fragments {
			if !strings.Contains(series, f) {
				continue lines
			}
		}
		v, _ := strconv.ParseFloat(value, 64)
		sum += v
	}
	return sum
}

// readyz returns the status code of GET /readyz.
func (r *replica) readyz(t *testing.T) int {
	t.Helper()
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 10 * time.Second}
	resp, err := client.Get("http://" + r.addr + "/readyz")
	if err != nil {
		t.Fatalf("GET %s/readyz: %v", r.name, err)
	}
	_ = resp.Body.Close()
	return resp.StatusCode
}

func (r *replica) leads(t *testing.T) bool { return r.metric(t, "jobreaper_leader") == 1 }

func (r *replica) passes(t *testing.T) float64 { return r.metric(t, "jobreaper_passes_total") }

func (r *replica) signal(t *testing.T, sig syscall.Signal) {
	t.Helper()
	if err := r.cmd.Process.Signal(sig); err != nil {
		t.Fatalf("signalling %s: %v", r.name, err)
	}
}

// Two daemons of the real binary on one database and queue set: only one
// runs passes. SIGSTOP the leader: the other leads, within two intervals
// of the last renewal (polled with room for a slow machine, never
// timed). SIGCONT the old one: it starts no reap and no pass until it
// holds the leader lease again, while the new leader reaps. A clean exit
// releases the leader lease, and the other takes over.
func TestLeaderLeaseOneReplicaRunsPasses(t *testing.T) {
	t.Parallel()
	bin := jobstest.BuildJobreaper(t)
	db := jobstest.New(t)
	q := unique("fleet")
	args := []string{"--database-url", db.URL, "--schema", db.Schema, "--redis-url", redisTestURL(), "--queues", q,
		"--interval", "2s", "--stall-timeout", "11m"}
	a := startReplica(t, bin, "replica A", args...)
	waitFor(t, "A leads", func() bool { return a.leads(t) })
	b := startReplica(t, bin, "replica B", args...)
	waitFor(t, "A ran three passes while B was up", func() bool {
		return a.metric(t, "jobreaper_passes_total", `outcome="ok"`) >= 3 && b.metric(t, "jobreaper_leader") == 0
	})
	if n := b.passes(t); n != 0 {
		t.Fatalf("B, a follower, ran %v passes", n)
	}
	// A follower is ready: it could run passes.
	if code := b.readyz(t); code != http.StatusOK {
		t.Fatalf("the follower's /readyz = %d, want 200", code)
	}

	a.signal(t, syscall.SIGSTOP)
	waitFor(t, "B leads once A stopped renewing", func() bool { return b.leads(t) })
	db.JobType(t, "report.export", "30 minutes", "", "")
	id := unique("J-fleet")
	rdb := realRedis(t)
	t.Cleanup(func() { rdb.Del(context.Background(), queue.MarkerKey(id)) })
	db.Insert(t, jobstest.Job{ID: id, Type: "report.export", Generation: 1, Queue: q,
		StartedAgo: jobstest.Ago(31 * time.Minute), IdleAgo: 21 * time.Minute})
	activeTask(t, id, q)
	waitFor(t, "B reaps the stalled job", func() bool { return db.Read(t, id).Status == jobs.StatusFailed })

	resumedAt := len(a.stderr.String())
	a.signal(t, syscall.SIGCONT)
	waitFor(t, "A, resumed, reports it does not lead", func() bool { return a.metric(t, "jobreaper_leader") == 0 })
	aPasses, bPasses := a.passes(t), b.metric(t, "jobreaper_passes_total", `outcome="ok"`)
	waitFor(t, "B ran three more passes", func() bool {
		return b.metric(t, "jobreaper_passes_total", `outcome="ok"`) >= bPasses+3
	})
	if n := a.passes(t); n != aPasses {
		t.Fatalf("A ran passes after it was resumed without the leader lease: %v -> %v", aPasses, n)
	}
	if since := a.stderr.String()[resumedAt:]; strings.Contains(since, "job reaped") {
		t.Fatalf("A reaped after it was resumed:\n%s", since)
	}
	if db.Events(t, id, "reaped") != 1 {
		t.Fatalf("the job has %d reaped events, want 1", db.Events(t, id, "reaped"))
	}

	// B exits cleanly and releases the leader lease; A takes it.
	b.signal(t, syscall.SIGTERM)
	if err := b.cmd.Wait(); err != nil {
		t.Fatalf("B's clean exit: %v", err)
	}
	if !strings.Contains(b.stderr.String(), "leader lease released") {
		t.Fatalf("B did not release its leader lease:\n%s", b.stderr.String())
	}
	waitFor(t, "A leads again", func() bool { return a.leads(t) })
}

// Two daemons with different queue sets each lead their own set.
func TestLeaderLeaseEachQueueSetHasItsLeader(t *testing.T) {
	t.Parallel()
	bin := jobstest.BuildJobreaper(t)
	db := jobstest.New(t)
	common := []string{"--database-url", db.URL, "--schema", db.Schema, "--redis-url", redisTestURL(),
		"--interval", "2s", "--stall-timeout", "11m"}
	a := startReplica(t, bin, "replica A", append(common, "--queues", unique("setA"))...)
	b := startReplica(t, bin, "replica B", append(common, "--queues", unique("setB"))...)
	waitFor(t, "both lead and run passes", func() bool {
		return a.leads(t) && b.leads(t) &&
			a.metric(t, "jobreaper_passes_total", `outcome="ok"`) >= 2 && b.metric(t, "jobreaper_passes_total", `outcome="ok"`) >= 2
	})
	if n := db.Count(t, `SELECT count(*) FROM `+db.Table("leader_leases")); n != 2 {
		t.Fatalf("%d leader lease rows, want one per queue set", n)
	}
}
