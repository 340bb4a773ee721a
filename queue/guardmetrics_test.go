package queue

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// Every decision of jobreaper_guard_decisions_total exists at 0 as soon as
// a Guard registers it, and the help text lists each, so dashboards and
// alerts see every series before its first occurrence.
func TestGuardMetricsExistAtZeroAndAreListedInTheHelp(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	NewGuard(nil, nil, WithRegisterer(reg))
	// A second Guard on the same registry shares the counter.
	NewGuard(nil, nil, WithRegisterer(reg))
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	if len(families) != 1 || families[0].GetName() != "jobreaper_guard_decisions_total" {
		t.Fatalf("registered families = %v, want jobreaper_guard_decisions_total only", families)
	}
	mf := families[0]
	got := map[string]float64{}
	for _, m := range mf.GetMetric() {
		got[m.GetLabel()[0].GetValue()] = m.GetCounter().GetValue()
	}
	want := []string{"claimed", "refused_reaped", "refused_failed", "acked_completed", "claim_lost", "no_row",
		"unavailable", "no_task_id", "bad_job_id", "bad_marker", "completed", "auto_completed", "no_completion", "released",
		"failed", "abandoned", "lost_job", "settle_failed"}
	if len(got) != len(want) || len(guardDecisions()) != len(want) {
		t.Fatalf("series = %v, guardDecisions = %v; want exactly %v", got, guardDecisions(), want)
	}
	for _, d := range want {
		if v, ok := got[d]; !ok || v != 0 {
			t.Errorf("decision %q: value %v, present %v; want 0", d, v, ok)
		}
		if !strings.Contains(mf.GetHelp(), d+",") && !strings.Contains(mf.GetHelp(), d+").") {
			t.Errorf("help %q does not list %q", mf.GetHelp(), d)
		}
	}
}

// guardDecisions returns every value of jobreaper_guard_decisions_total's
// decision label, in the order of the metric's help text.
func guardDecisions() []string { return append([]string(nil), decisionNames[:]...) }
