package main

import (
	"bytes"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jobreaper/jobreaper/internal/failpoint"
	"github.com/jobreaper/jobreaper/internal/fleettest"
	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
	"github.com/jobreaper/jobreaper/queue/redistest"
)

// panicLine is what the reaper logs, once, for a pass that panicked.
const panicLine = `msg="pass panicked`

// B41: three replicas of one queue set, a pass every second; the first
// one to lead panics at the start of every pass (a failpoint in its
// process only). Each panic is logged once with its stack and counted;
// after three passes in a row the leader stops answering ready and
// healthy, exports jobreaper_leader 0, releases its leader lease and exits
// with code 3, within three intervals (checked with a tenfold margin);
// another replica takes the leader lease and reaps the stalled job J41.
func TestCase_B41_APanickingLeaderGivesItsLeaseUpAndExits3(t *testing.T) {
	t.Parallel()
	const interval = time.Second
	bin := fleettest.BuildJobreaper(t)
	db := jobstest.New(t)
	db.JobType(t, "report.export", "30 minutes", "", "")
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	q := "b41"
	stalledActiveJob(t, db, rdb, q, "J41")
	opts := func(name, failpoints string) fleettest.DaemonOptions {
		return fleettest.DaemonOptions{Name: name, DatabaseURL: db.URL, RedisURL: srv.URL, Failpoints: failpoints,
			Args: []string{"--schema", db.Schema, "--queues", q, "--interval", interval.String(), "--stall-timeout", "11m"}}
	}
	a := fleettest.StartDaemon(t, bin, opts("replica A (panics)", "pass=panic"))
	fleettest.WaitFor(t, "A leads", a.Leads)
	led := time.Now()
	others := []*fleettest.Daemon{fleettest.StartDaemon(t, bin, opts("replica B", "")), fleettest.StartDaemon(t, bin, opts("replica C", ""))}

	// A's fatal state, sampled before it exits.
	giveUp := 10 * 3 * interval
	var ready, healthy int
	var readyBody string
	for {
		ready, readyBody = a.Probe("/readyz")
		if ready == http.StatusServiceUnavailable {
			break
		}
		if time.Since(led) > giveUp {
			t.Fatalf("A still answers /readyz %d %s after leading for %s while its passes panic", ready, readyBody, giveUp)
		}
		time.Sleep(20 * time.Millisecond) // polling
	}
	healthy, _ = a.Probe("/healthz")
	leader := a.Metric("jobreaper_leader")
	panicked, ok := a.Metric("jobreaper_passes_total", `outcome="panicked"`), a.Metric("jobreaper_passes_total", `outcome="ok"`)
	t.Logf("A answered /readyz 503 %s after it took the leader lease: %q", time.Since(led).Round(time.Millisecond), readyBody)
	if healthy != http.StatusServiceUnavailable {
		t.Errorf("A's /healthz = %d once it gave up, want 503", healthy)
	}
	if leader != 0 {
		t.Errorf("A exports jobreaper_leader %v once it gave up, want 0", leader)
	}
	if panicked != 3 || ok != 0 {
		t.Errorf("A's passes_total: panicked %v, ok %v; want 3 and 0", panicked, ok)
	}
	if !strings.Contains(readyBody, "panicked") {
		t.Errorf("A's /readyz body %q does not say why", readyBody)
	}
	if code := a.Wait(t); code != exitPanicked {
		t.Fatalf("A exited with %d, want %d", code, exitPanicked)
	}
	log := a.Log.String()
	if n := a.Log.Count(panicLine); n != 3 {
		t.Errorf("A logged %d panicked passes, want 3 (one line each):\n%s", n, log)
	}
	if n := a.Log.Count(panicLine, "level=ERROR", "failpoint pass: injected panic", "goroutine ", "reaper.(*Reaper).pass"); n != 3 {
		t.Errorf("%d of A's panic lines are ERRORs with the panic and its stack, want 3:\n%s", n, log)
	}
	if !strings.Contains(log, "leader lease released") {
		t.Errorf("A did not release its leader lease:\n%s", log)
	}

	// Another replica takes over and reaps J41.
	var b *fleettest.Daemon
	fleettest.WaitFor(t, "B or C leads", func() bool {
		for _, d := range others {
			if d.Leads() {
				b = d
				return true
			}
		}
		return false
	})
	fleettest.WaitFor(t, b.Name+" reaps J41", func() bool { return db.Read(t, "J41").Status == jobs.StatusFailed })
	if row := db.Read(t, "J41"); row.FailureReason != jobs.ReasonStalled {
		t.Fatalf("J41 = %+v, want FAILED stalled", row)
	}
	if n := b.Metric("jobreaper_jobs_reaped_total", `reason="stalled"`); n != 1 {
		t.Fatalf("%s reaped %v jobs, want 1 (J41)", b.Name, n)
	}
	if pid := db.Count(t, `SELECT holder_pid FROM `+db.Table("leader_leases")); int(pid) != b.Pid() {
		t.Fatalf("the leader lease is held by pid %d, want %s's %d", pid, b.Name, b.Pid())
	}
	for _, d := range others {
		if code := d.Stop(t); code != 0 {
			t.Fatalf("%s's exit after SIGTERM: %d", d.Name, code)
		}
	}
}

// A SIGTERM that lands while a leader lease renewal is in flight (the
// attempt held up by a failpoint, a pass running meanwhile) is a clean
// exit: the leader lease row is deleted, so another replica need not wait
// for its expiry, and no "leader lease lost during a pass" warning is
// logged, since nothing was lost.
func TestSIGTERMDuringALeaderLeaseAttemptReleasesTheLease(t *testing.T) {
	t.Parallel()
	bin := fleettest.BuildJobreaper(t)
	db := jobstest.New(t)
	srv := redistest.Start(t)
	// Every attempt takes 3 s, longer than the 2 s between renewals
	// (interval/3), so the renewals run back to back and a signal lands in
	// one; the first pass sleeps 10 s at its start, so they run beside it.
	d := fleettest.StartDaemon(t, bin, fleettest.DaemonOptions{DatabaseURL: db.URL, RedisURL: srv.URL,
		Failpoints: "lease=sleep:3s;pass=sleep:10s",
		Args:       []string{"--schema", db.Schema, "--queues", "lease-sigterm", "--interval", "6s", "--stall-timeout", "13m"}})
	passAt := d.AwaitLog(t, 0, "failpoint pass reached")
	if !d.Leads() {
		t.Fatal("the daemon runs a pass without leading")
	}
	d.AwaitLog(t, passAt, "failpoint lease reached")
	d.Signal(t, syscall.SIGTERM)
	if code := d.Wait(t); code != 0 {
		t.Fatalf("exit code %d after SIGTERM, want 0", code)
	}
	if n := db.Count(t, `SELECT count(*) FROM `+db.Table("leader_leases")); n != 0 {
		t.Errorf("%d leader lease rows after the clean exit, want 0 (the row waits for its expiry)", n)
	}
	if n := d.Log.Count("leader lease lost during a pass"); n != 0 {
		t.Errorf("a SIGTERM logged that the leader lease was lost:\n%s", d.Log.String())
	}
}

// run --once whose pass panics prints its summary, with "panicked": true,
// logs the panic once with its stack, and exits 1, never 0.
func TestRunOncePanickedPassExits1(t *testing.T) {
	t.Parallel()
	bin := fleettest.BuildJobreaper(t)
	db := jobstest.New(t)
	args := []string{"run", "--once", "--database-url", db.URL, "--schema", db.Schema, "--redis-url", redisTestURL(),
		"--queues", unique("once-panic")}
	r := fleettest.Run(t, bin, "pass=panic", nil, append(args, "--output", "json")...)
	t.Logf("exit %d\nstdout: %s\nstderr: %s", r.Code, r.Stdout, r.Stderr)
	if r.Code != exitPassErrors {
		t.Fatalf("exit code %d, want %d", r.Code, exitPassErrors)
	}
	doc := requireOneJSONResult(t, r.Stdout)
	if got := string(doc["panicked"]); got != "true" {
		t.Fatalf(`"panicked" = %s, want true`, got)
	}
	if n := strings.Count(r.Stderr, panicLine); n != 1 || !strings.Contains(r.Stderr, "goroutine ") {
		t.Fatalf("the panic is logged %d times (want once, with its stack):\n%s", n, r.Stderr)
	}
	text := fleettest.Run(t, bin, "pass=panic", nil, args...)
	if text.Code != exitPassErrors || !strings.Contains(text.Stdout, ", panicked (") {
		t.Fatalf("text summary: exit %d, stdout %q; want exit 1 and the summary saying panicked", text.Code, text.Stdout)
	}
}

// A release build (no failpoints tag) ignores JOBREAPER_FAILPOINTS: asked
// to panic at every pass and to stop at every leader lease attempt, its
// pass is clean; and it holds no symbol of the failpoint package.
func TestReleaseBuildIgnoresFailpoints(t *testing.T) {
	t.Parallel()
	release := fleettest.BuildJobreaperRelease(t)
	db := jobstest.New(t)
	r := fleettest.Run(t, release, "pass=panic;lease=stop", nil, "run", "--once", "--output", "json",
		"--database-url", db.URL, "--schema", db.Schema, "--redis-url", redisTestURL(), "--queues", unique("release"))
	if r.Code != exitOK || strings.Contains(r.Stderr, "failpoint") {
		t.Fatalf("the release build reacted to the failpoints: exit %d\n%s", r.Code, r.Stderr)
	}
	var sum struct {
		Panicked *bool `json:"panicked"`
	}
	if err := json.Unmarshal([]byte(r.Stdout), &sum); err != nil || sum.Panicked == nil || *sum.Panicked {
		t.Fatalf(`summary %q (%v): want "panicked": false`, r.Stdout, err)
	}
	// Nothing of the package but its empty Inject is in the release
	// binary, and nothing in it names the variable.
	symbols := func(bin string) []string {
		out, err := exec.Command("go", "tool", "nm", bin).Output()
		if err != nil {
			t.Fatalf("go tool nm %s: %v", bin, err)
		}
		var found []string
		for _, line := range strings.Split(string(out), "\n") {
			if fields := strings.Fields(line); len(fields) == 3 && strings.Contains(fields[2], "jobreaper/internal/failpoint.") {
				found = append(found, fields[2])
			}
		}
		return found
	}
	names := func(bin string) bool {
		raw, err := os.ReadFile(bin)
		if err != nil {
			t.Fatal(err)
		}
		return bytes.Contains(raw, []byte(failpoint.Env))
	}
	if got := symbols(release); len(got) > 1 || len(got) == 1 && !strings.HasSuffix(got[0], "failpoint.Inject") || names(release) {
		t.Fatalf("the release build holds failpoint symbols %v, or the variable's name (%v)", got, names(release))
	}
	// The checks can see them: the failpoints build has both.
	withTag := fleettest.BuildJobreaper(t)
	if len(symbols(withTag)) < 2 || !names(withTag) {
		t.Fatal("the failpoints build holds no more failpoint symbols, or not the variable's name: the checks above prove nothing")
	}
}
