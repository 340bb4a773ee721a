package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jobreaper/jobreaper/internal/fleettest"
	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
	"github.com/jobreaper/jobreaper/queue/redistest"
	"github.com/jobreaper/jobreaper/reaper"
)

// The reaper binary (built once for the test) is killed with SIGKILL at a
// random point of `run --once` over faultJobsPerRound new stalled jobs, as
// many times as JOBREAPER_FAULT_KILLS says (20 by default). Half of the
// points, drawn from the seeded source, are a delay uniform over the time
// a whole run takes (measured on the first round, and again on every run
// that ends before its kill, which is not counted): they fall in the
// start-up, the marker re-assertion, the listing, the loads and the reaps.
// The other half are a short delay after the run's log showed a random
// number of reaped jobs: they fall between a batch's COMMIT and its
// markers, inside the next batch's transaction, or just after. After each
// kill: no half-written reap anywhere in the schema; then a good pass (the
// binary again, uninterrupted) exits 0 without errors, every job of the
// round is reaped, and every reaped job has its marker with a TTL of 7
// days from its reap.
func TestReliabilityFaults_ReaperSIGKILLMidPass(t *testing.T) {
	t.Parallel()
	kills := faultKills(t)
	rng := faultRand(t)
	bin := fleettest.BuildJobreaperRelease(t)
	f := newFaultFixture(t)
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	serveLiveQueue(t, rdb)
	args := []string{"run", "--once", "--output", "json", "--config", f.config, "--database-url", f.db.URL,
		"--schema", f.db.Schema, "--redis-url", srv.URL, "--queues", faultQueues}

	landed, violations, lost := 0, 0, 0
	defer func() {
		jobstest.Figure(t, faultSuite, "reaper_sigkill", landed)
		jobstest.Figure(t, faultSuite, "violations", violations)
		jobstest.Figure(t, faultSuite, "rows_lost", lost)
	}()
	// goodPass runs the binary to its end and requires a clean pass.
	goodPass := func(what string) time.Duration {
		t.Helper()
		cmd := exec.CommandContext(t.Context(), bin, append(slices.Clone(args), "--log-level", "warn")...)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		start := time.Now()
		err := cmd.Run()
		took := time.Since(start)
		var sum reaper.Result
		if jerr := json.Unmarshal(stdout.Bytes(), &sum); err != nil || jerr != nil || sum.Errors != 0 {
			t.Fatalf("good pass %s: %v, summary %q (%v)\n%s", what, err, stdout.String(), jerr, stderr.String())
		}
		if cerr := sum.CheckScanned(); cerr != nil {
			t.Fatalf("good pass %s: %v", what, cerr)
		}
		requireNoScanMismatch(t, stderr.String())
		return took
	}
	// check runs the checks due after a round's good pass.
	check := func(what, like string) {
		t.Helper()
		if n := f.count(t, like, jobs.StatusFailed); n != faultJobsPerRound {
			t.Errorf("after %s: %d of %d stalled jobs reaped", what, n, faultJobsPerRound)
			violations++
		}
		violations += f.checkReaps(t, what) + f.checkMarkers(t, rdb, like, what)
		if n := f.lost(t, like, faultJobsPerRound); n != 0 {
			t.Errorf("after %s: %d job rows lost", what, n)
			lost += n
		}
	}

	// The first round is not killed: it measures how long a run takes.
	like := f.addStalled(t, rdb, faultQueue, "kill00", faultJobsPerRound)
	window := goodPass("of round 0 (not killed)")
	check("round 0", like)

	// Where each kill fell, judged afterwards from what it had written.
	fell := map[string]int{}
	for round := 1; landed < kills; round++ {
		if round > 3*kills {
			t.Fatalf("only %d of %d kills landed in %d rounds: every other run ended before its kill", landed, kills, round-1)
		}
		prefix := fmt.Sprintf("kill%03d", round)
		like := f.addStalled(t, rdb, faultQueue, prefix, faultJobsPerRound)
		var point killPoint
		if rng.IntN(2) == 0 {
			point = killPoint{delay: between(rng, 0, window)}
		} else {
			point = killPoint{afterReaps: 1 + rng.IntN(faultJobsPerRound), delay: between(rng, 0, 20*time.Millisecond)}
		}
		killed, ran := killRun(t, bin, args, point)
		if killed {
			landed++
		} else {
			// A whole run over a new round: the window follows its length,
			// which grows with the markers every run re-asserts.
			window = ran
		}
		what := fmt.Sprintf("SIGKILL %d (round %d, %s)", landed, round, point)
		if !killed {
			t.Logf("round %d: the run ended after %s, before its kill at %s; not counted", round, ran.Round(time.Millisecond), point)
			what = fmt.Sprintf("round %d (not killed)", round)
		}
		// Right after the kill: nothing half-written, whatever it did.
		violations += f.checkReaps(t, what)
		reaped := f.count(t, like, jobs.StatusFailed)
		missing := f.missingMarkers(t, rdb, like)
		if killed {
			switch {
			case reaped == 0:
				fell["before any reap of the round"]++
			case reaped < faultJobsPerRound && missing > 0:
				fell["after a committed reap transaction, before its markers"]++
			case reaped < faultJobsPerRound:
				fell["between two reap transactions"]++
			case missing > 0:
				fell["after the reaps, before all their markers"]++
			default:
				fell["after the reaps and their markers"]++
			}
			t.Logf("%s: %d of %d jobs reaped, %d of their markers missing", what, reaped, faultJobsPerRound, missing)
		}
		goodPass("after " + what)
		check(what, like)
	}
	t.Logf("%d kills landed: %v", landed, fell)
}

// killPoint is where a run of the binary is killed: delay after its
// start, or, with afterReaps > 0, delay after its log shows that many
// reaped jobs. A batch's "job reaped" lines are logged after its COMMIT
// and before its markers are written, so such a kill falls between the
// commit of a batch and its markers, or just after.
type killPoint struct {
	afterReaps int
	delay      time.Duration
}

func (p killPoint) String() string {
	if p.afterReaps > 0 {
		return fmt.Sprintf("%s after its log showed %d reaped jobs", p.delay.Round(time.Millisecond), p.afterReaps)
	}
	return fmt.Sprintf("%s into the run", p.delay.Round(time.Millisecond))
}

// killRun runs the binary with args (its log at info level, which names
// each reaped job) and kills it with SIGKILL at point.
// It returns whether the kill landed (false when the run ended first) and
// how long the process ran.
func killRun(t *testing.T, bin string, args []string, point killPoint) (killed bool, ran time.Duration) {
	t.Helper()
	cmd := exec.Command(bin, append(slices.Clone(args), "--log-level", "info")...)
	logs, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	started := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	reaped := make(chan struct{})
	exited := make(chan error, 1)
	go func() {
		// Read the log to its end (the process's exit), then wait for it.
		sc := bufio.NewScanner(logs)
		sc.Buffer(make([]byte, 64*1024), 1024*1024)
		seen := 0
		for sc.Scan() {
			if strings.Contains(sc.Text(), `msg="job reaped"`) {
				if seen++; seen == point.afterReaps {
					close(reaped)
				}
			}
		}
		_, _ = io.Copy(io.Discard, logs)
		exited <- cmd.Wait()
	}()
	start := make(<-chan time.Time)
	if point.afterReaps == 0 {
		start = time.After(0)
	}
	var timer <-chan time.Time
	for {
		select {
		case <-exited:
			return false, time.Since(started)
		case <-start:
			start, timer = nil, time.After(point.delay)
		case <-reaped:
			reaped, timer = nil, time.After(point.delay)
		case <-timer:
			if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
				t.Fatalf("SIGKILL: %v", err)
			}
			<-exited
			ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus)
			return ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL, time.Since(started)
		}
	}
}
