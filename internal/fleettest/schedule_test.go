package fleettest_test

import (
	"slices"
	"testing"
	"time"

	"github.com/jobreaper/jobreaper/internal/fleettest"
)

var scheduleParams = fleettest.ScheduleParams{Duration: 2 * time.Minute, Kinds: fleettest.FaultKinds[:7],
	StallTimeout: 10 * time.Second, LeaseTTL: 1500 * time.Millisecond, Settle: 4 * time.Second, Start: 5 * time.Second}

// A seed replays its schedule: the same seed gives the same faults, a
// different one other faults; every kind comes once before any repeats,
// and each fits the run and its bounds.
func TestScheduleReplaysItsSeed(t *testing.T) {
	a, b := fleettest.Schedule(42, scheduleParams), fleettest.Schedule(42, scheduleParams)
	if !slices.Equal(a, b) {
		t.Fatalf("seed 42 gave two schedules:\n%v\n%v", a, b)
	}
	if c := fleettest.Schedule(43, scheduleParams); slices.Equal(a, c) {
		t.Fatalf("seeds 42 and 43 gave the same schedule: %v", a)
	}
	if len(a) < len(scheduleParams.Kinds) {
		t.Fatalf("2 minutes gave %d faults, want every one of the %d kinds: %v", len(a), len(scheduleParams.Kinds), a)
	}
	seen := map[string]bool{}
	for i, f := range a {
		if i < len(scheduleParams.Kinds) {
			if seen[f.Kind] {
				t.Fatalf("%s repeats before every kind came: %v", f.Kind, a)
			}
			seen[f.Kind] = true
		}
		if f.At+f.Length+scheduleParams.Settle > scheduleParams.Duration {
			t.Fatalf("fault %v ends past the run", f)
		}
		if f.Kind == fleettest.FaultWorkersCut && f.Length >= scheduleParams.StallTimeout {
			t.Fatalf("a workers-only cut of %s, not shorter than the stall timeout", f.Length)
		}
		if f.Kind == fleettest.FaultLeaderStop && f.Length <= scheduleParams.LeaseTTL {
			t.Fatalf("a SIGSTOP of %s, not longer than the lease TTL", f.Length)
		}
		if i > 0 && f.At < a[i-1].At+a[i-1].Length+scheduleParams.Settle {
			t.Fatalf("fault %v starts before %v settled", f, a[i-1])
		}
	}
}
