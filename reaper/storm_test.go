package reaper_test

import (
	"testing"

	"github.com/jobreaper/jobreaper/reaper"
)

// StormCheck at its boundaries: exactly max_stalled_per_pass is no storm,
// one more is; the fraction limit needs 10 stalled jobs (9 never trip
// it) and a share strictly above the fraction; 0 lifts each limit; the
// count limit is named first when both trip; the jobs stalling soon count with
// the stalled ones, but stalling soon alone is no storm (nothing to hold yet).
func TestStormCheckBoundaries(t *testing.T) {
	t.Parallel()
	defaults := reaper.StormLimits{MaxStalled: 100, MaxFraction: 0.5}
	for _, c := range []struct {
		name                      string
		stalled, stalling, judged int
		limits                    reaper.StormLimits
		hold                      bool
		limit, whyPrefix          string
	}{
		{"nothing stalled", 0, 0, 1000, defaults, false, "", ""},
		{"exactly 100 of 1000", 100, 0, 1000, defaults, false, "", ""},
		{"101 of 1000", 101, 0, 1000, defaults, true, reaper.LimitMaxStalled,
			"101 stalled jobs in one pass, more than max_stalled_per_pass 100"},
		{"9 of 9: too few for the fraction", 9, 0, 9, defaults, false, "", ""},
		{"9 of 10", 9, 0, 10, defaults, false, "", ""},
		{"10 of 10", 10, 0, 10, defaults, true, reaper.LimitMaxFraction,
			"10 stalled jobs of 10 active tasks judged, more than max_stalled_fraction 0.5"},
		{"10 of 20: exactly half", 10, 0, 20, defaults, false, "", ""},
		{"10 of 19: more than half", 10, 0, 19, defaults, true, reaper.LimitMaxFraction, "10 stalled jobs of 19"},
		{"11 of 22: exactly half", 11, 0, 22, defaults, false, "", ""},
		{"12 of 23", 12, 0, 23, defaults, true, reaper.LimitMaxFraction, "12 stalled jobs of 23"},
		{"10 of 100 at 0.1: exactly the fraction as written", 10, 0, 100, reaper.StormLimits{MaxFraction: 0.1}, false, "", ""},
		{"11 of 100 at 0.1", 11, 0, 100, reaper.StormLimits{MaxFraction: 0.1}, true, reaper.LimitMaxFraction, "11 stalled jobs of 100"},
		{"30 of 100 at 0.3", 30, 0, 100, reaper.StormLimits{MaxFraction: 0.3}, false, "", ""},
		{"both trip: the count is named", 200, 0, 200, defaults, true, reaper.LimitMaxStalled, "200 stalled jobs in one pass"},
		{"max_stalled_per_pass 0: no count limit", 5000, 0, 100000, reaper.StormLimits{MaxFraction: 0.5}, false, "", ""},
		{"max_stalled_fraction 0: no fraction limit", 100, 0, 100, reaper.StormLimits{MaxStalled: 100}, false, "", ""},
		{"no limit at all", 100000, 0, 100000, reaper.StormLimits{}, false, "", ""},
		{"fraction 1 never trips", 50, 0, 50, reaper.StormLimits{MaxFraction: 1}, false, "", ""},
		{"judged below stalled counts as stalled", 10, 0, 3, reaper.StormLimits{MaxFraction: 0.99}, true, reaper.LimitMaxFraction,
			"10 stalled jobs of 10"},
		{"stalling soon alone: nothing to hold yet", 0, 20, 20, defaults, false, "", ""},
		{"1 stalled and 9 stalling soon of 20: too few and half", 1, 9, 20, defaults, false, "", ""},
		{"10 stalled and 10 stalling soon of 20: the stalls straddle passes", 10, 10, 20, defaults, true, reaper.LimitMaxFraction,
			"10 stalled jobs and 10 stalling soon of 20 active tasks judged"},
		{"1 stalled and 9 stalling soon of 10", 1, 9, 10, defaults, true, reaper.LimitMaxFraction, "1 stalled jobs and 9 stalling soon of 10"},
		{"50 stalled and 51 stalling soon: the count limit", 50, 51, 10000, defaults, true, reaper.LimitMaxStalled,
			"50 stalled jobs and 51 stalling soon in one pass, more than max_stalled_per_pass 100"},
	} {
		got := reaper.StormCheck(c.stalled, c.stalling, c.judged, c.limits)
		if got.Hold != c.hold || got.Limit != c.limit || len(got.Why) < len(c.whyPrefix) || got.Why[:len(c.whyPrefix)] != c.whyPrefix {
			t.Errorf("%s: StormCheck(%d, %d, %d, %+v) = %+v; want hold %v, limit %q, why starting %q",
				c.name, c.stalled, c.stalling, c.judged, c.limits, got, c.hold, c.limit, c.whyPrefix)
		}
		if !c.hold && got.Why != "" {
			t.Errorf("%s: no storm but why %q", c.name, got.Why)
		}
	}
}
