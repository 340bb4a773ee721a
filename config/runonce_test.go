package config

import (
	"slices"
	"testing"
	"time"
)

// run --once never reads marker_check_window (a manual pass re-asserts
// every marker at once), so the daemon's rule "at least interval" must not
// stop it; every other setting's problems still do.
func TestRunOnceKeysLeaveOutOnlyTheMarkerWindowRule(t *testing.T) {
	t.Parallel()
	if slices.Contains(RunOnceKeys, "marker_check_window") || len(RunOnceKeys) != len(knownKeys())-1 {
		t.Fatalf("RunOnceKeys = %v, want every key but marker_check_window", RunOnceKeys)
	}
	c := valid()
	c.Interval, c.MarkerCheckWindow = 2*time.Minute, time.Minute
	if err := c.Validate(); err == nil {
		t.Fatal("the daemon's rule no longer refuses a window below the interval")
	}
	if err := Only(c.Validate(), RunOnceKeys...); err != nil {
		t.Fatalf("run --once refused the daemon's window rule: %v", err)
	}
	c.StallTimeout = time.Minute // below 2 x heartbeat + interval: still run --once's problem
	if err := Only(c.Validate(), RunOnceKeys...); err == nil {
		t.Fatal("run --once no longer checks the stall timeout's floor")
	}
}
