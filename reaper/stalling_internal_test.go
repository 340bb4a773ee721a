package reaper

import (
	"testing"
	"time"

	"github.com/jobreaper/jobreaper/internal/pgstore"
	"github.com/jobreaper/jobreaper/jobs"
)

// A job is stalling soon when it is not stalled yet but within one
// heartbeat interval of its stall timeout, idle counted as the rule
// counts it (from the outage end when that is later than updated_at);
// the heartbeat interval is the one the rule's floor implies.
func TestStallingSoon(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	stall, hb, interval := 10*time.Second, 2*time.Second, time.Second
	rule := pgstore.StallRule{DefaultStallTimeout: stall, MinStallTimeout: 2*hb + interval, DefaultHardTimeout: jobs.HardTimeoutDefault}
	if got := heartbeatInterval(rule, interval); got != hb {
		t.Fatalf("heartbeatInterval = %s, want %s", got, hb)
	}
	if got := heartbeatInterval(rule, time.Hour); got != 0 {
		t.Fatalf("heartbeatInterval with an interval above the floor = %s, want 0", got)
	}
	started := now.Add(-time.Minute)
	job := func(idle time.Duration) *jobs.Snapshot {
		return &jobs.Snapshot{ID: "J", Type: "t", Status: jobs.StatusProcessing, Generation: 1, StartedAt: &started,
			UpdatedAt: now.Add(-idle), Limits: &jobs.Limits{MaxRuntime: time.Second}}
	}
	for _, c := range []struct {
		name      string
		idle      time.Duration
		outageAgo time.Duration // 0: no outage end
		heartbeat time.Duration
		want      bool
	}{
		{"idle well within", 3 * time.Second, 0, hb, false},
		{"just under stall - heartbeat", stall - hb - time.Millisecond, 0, hb, false},
		{"exactly stall - heartbeat", stall - hb, 0, hb, true},
		{"just under the stall timeout", stall - time.Millisecond, 0, hb, true},
		{"stalled: reaped, not stalling", stall, 0, hb, false},
		{"heartbeat unknown", stall - time.Millisecond, 0, 0, false},
		{"held by the grace, its grace almost over", stall + time.Minute, stall - time.Second, hb, true},
		{"held by the grace, just after the outage", stall + time.Minute, time.Second, hb, false},
	} {
		r := rule
		if c.outageAgo > 0 {
			r.OutageEnd = now.Add(-c.outageAgo)
		}
		snap := job(c.idle)
		v := Decide(snap, now, r)
		if got := stallingSoon(snap, v, now, r, c.heartbeat); got != c.want {
			t.Errorf("%s: stallingSoon = %v (verdict %+v), want %v", c.name, got, v, c.want)
		}
	}
}
