package queue_test

import (
	"crypto/rand"
	"encoding/binary"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/jobreaper/jobreaper/jobs/jobstest"
)

// The randomized race suite: per interleaving, one job of each seed flow
// (course, video, batch) is run by 1 to 3 attempts that workers start
// through the real start guard, with heartbeats, batches, hangs,
// completions, failures and releases in a drawn order with drawn jitters,
// while the reaper's real passes (set-based reap, markers in a Redis of the
// test's own) run at drawn moments, an operator may requeue a failed job
// and the product may start a second life of an ID. Every job type's
// max_runtime is 1 microsecond and the stall timeout is drawn between 1
// microsecond and 10 milliseconds, so the passes reap jobs whose attempts
// hang, and the compare-and-sets decide every race. After each
// interleaving the invariants (race_invariants_test.go and
// race_check_test.go) are checked on what landed and what the callers
// were told.

// raceRunsEnv sets how many interleavings TestReliabilityRace_Interleavings
// runs (default raceRunsDefault); -rapid.checks overrides both.
const (
	raceRunsEnv     = "JOBREAPER_RACE_RUNS"
	raceRunsDefault = 500
)

// raceQueue is the asynq queue of every job of the suite, in the test's
// own Redis.
const raceQueue = "race"

// raceLiveQueue is a queue a live asynq server serves in the suite's Redis
// (serveRaceLiveQueue), which the passes scan beside raceQueue: a pass
// holds its marker repairs while no live server serves a queue of it, and
// raceQueue cannot be served, since the interleavings deliver its tasks
// themselves.
const raceLiveQueue = "race-live"

// raceRuns returns how many interleavings to run: JOBREAPER_RACE_RUNS, or
// raceRunsDefault.
func raceRuns(t *testing.T) int {
	v := os.Getenv(raceRunsEnv)
	if v == "" {
		return raceRunsDefault
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		t.Fatalf("%s=%q: want a positive number of interleavings", raceRunsEnv, v)
	}
	return n
}

// rapidFlagsGiven records, before the suite sets any, which of rapid's
// flags the command line or rapid's environment variables gave.
var rapidFlagsGiven = sync.OnceValue(func() map[string]bool {
	given := map[string]bool{}
	flag.Visit(func(f *flag.Flag) { given[f.Name] = true })
	for name, env := range map[string]string{"rapid.checks": "RAPID_CHECKS", "rapid.seed": "RAPID_SEED",
		"rapid.nofailfile": "RAPID_NOFAILFILE", "rapid.failfile": "RAPID_FAILFILE"} {
		if os.Getenv(env) != "" {
			given[name] = true
		}
	}
	return given
})

// setRapidFlags sets rapid's checks to runs and its seed to a random one,
// unless the command line or rapid's environment variables gave them, and
// returns the seed to replay the run with. Fail files are off unless asked
// for: the seed replays the whole sequence of plans.
func setRapidFlags(t *testing.T, runs int) uint64 {
	t.Helper()
	given := rapidFlagsGiven()
	must := func(name, value string) {
		if err := flag.Set(name, value); err != nil {
			t.Fatal(err)
		}
	}
	if !given["rapid.checks"] {
		must("rapid.checks", strconv.Itoa(runs))
	}
	if !given["rapid.nofailfile"] && !given["rapid.failfile"] {
		must("rapid.nofailfile", "true")
	}
	if given["rapid.seed"] {
		seed, err := strconv.ParseUint(flag.Lookup("rapid.seed").Value.String(), 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		return seed
	}
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	seed := binary.LittleEndian.Uint64(b[:]) | 1 // rapid takes 0 for "random"
	must("rapid.seed", strconv.FormatUint(seed, 10))
	return seed
}

// TestReliabilityRace_Interleavings runs JOBREAPER_RACE_RUNS (default 500)
// interleavings drawn by rapid and checks every invariant after each. On a
// failure rapid prints the seed and shrinks the plan; the figures record
// the seed whatever the outcome (go test -run
// '^TestReliabilityRace_Interleavings$' -rapid.seed=<seed> ./queue/
// replays the same plans; the goroutines' timing differs run to run).
func TestReliabilityRace_Interleavings(t *testing.T) {
	t.Parallel()
	s := newRaceSuite(t)
	runs := raceRuns(t)
	seed := setRapidFlags(t, runs)
	var (
		interleavings, violations, lost atomic.Int64
		firstFailure                    atomic.Bool
	)
	t.Cleanup(func() {
		jobstest.Figure(t, "race", "seed", fmt.Sprintf("-rapid.seed=%d", seed))
		jobstest.Figure(t, "race", "interleavings", interleavings.Load())
		jobstest.Figure(t, "race", "violations", violations.Load())
		jobstest.Figure(t, "race", "rows_lost", lost.Load())
		s.seenMu.Lock()
		defer s.seenMu.Unlock()
		t.Logf("writes landed and refused over all interleavings: %v", s.seen)
	})
	start := time.Now()
	rapid.Check(t, func(rt *rapid.T) {
		p := drawPlan(rt)
		interleavings.Add(1)
		out := s.interleave(rt, p)
		if len(out.violations) == 0 {
			return
		}
		// The first failing interleaving is the one rapid found; the runs
		// that follow replay and shrink it, and are not counted again.
		if firstFailure.CompareAndSwap(false, true) {
			violations.Add(int64(len(out.violations)))
			lost.Add(int64(out.lost))
		}
		rt.Fatalf("%d invariant violations in interleaving %d:\n  %s\nplan:\n%s\nlog:\n%s",
			len(out.violations), out.n, strings.Join(out.violations, "\n  "), p, out.log)
	})
	t.Logf("%d interleavings in %s", interleavings.Load(), time.Since(start).Round(time.Millisecond))
	s.requireExercised(t, int(interleavings.Load()))
}

// requireExercised fails the test when a run of at least 400
// interleavings never saw one of the races it exists for: a suite whose
// plans stopped reaching them would pass without meaning anything. At 500
// interleavings on a loaded 2-core machine the rarest of them, requeues of
// a failed job, came about 20 times.
func (s *raceSuite) requireExercised(t *testing.T, n int) {
	t.Helper()
	if n < 400 {
		return
	}
	s.seenMu.Lock()
	defer s.seenMu.Unlock()
	for _, kind := range []string{"claimed", "completed", "failed", "reaped", "released", "requeued", "advanced",
		"heartbeat", "second_life", "late_result_rejected", "replayed", "guard_refused_reaped"} {
		if s.seen[kind] == 0 {
			t.Errorf("%d interleavings never saw %s: the plans no longer reach that race", n, kind)
		}
	}
}

func (s *raceSuite) saw(counts map[string]int) {
	s.seenMu.Lock()
	defer s.seenMu.Unlock()
	for k, v := range counts {
		s.seen[k] += v
	}
}
