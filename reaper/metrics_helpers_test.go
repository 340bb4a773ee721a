package reaper_test

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/jobreaper/jobreaper/reaper"
)

// findSeries returns the series of metric name with exactly labels in
// reg, nil when no such series was written.
func findSeries(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) *dto.Metric {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
	series:
		for _, m := range f.GetMetric() {
			if len(m.GetLabel()) != len(labels) {
				continue
			}
			for _, l := range m.GetLabel() {
				if labels[l.GetName()] != l.GetValue() {
					continue series
				}
			}
			return m
		}
	}
	return nil
}

// metricValue returns the value of the counter or gauge name with exactly
// labels in reg, or 0 when no such series was written.
func metricValue(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	m := findSeries(t, reg, name, labels)
	if m == nil {
		return 0
	}
	if c := m.GetCounter(); c != nil {
		return c.GetValue()
	}
	return m.GetGauge().GetValue()
}

func TestMetricsExistAtZeroBeforeTheirFirstOccurrence(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	reaper.NewMetrics(reg)
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	series := map[string]int{}
	for _, f := range families {
		series[f.GetName()] = len(f.GetMetric())
	}
	want := map[string]int{
		"jobreaper_passes_total":       5, // ok, errors, failed, cancelled, panicked
		"jobreaper_pass_errors_total":  6, // clock, queues, list, load, reap, marker
		"jobreaper_jobs_reaped_total":  2, // stalled, lost_task
		"jobreaper_jobs_skipped_total": 17,
	}
	for name, n := range want {
		if series[name] != n {
			t.Errorf("%s has %d series before any pass, want %d", name, series[name], n)
		}
	}
	// The outage grace's holds, watched after every failover.
	if v := metricValue(t, reg, "jobreaper_jobs_skipped_total", map[string]string{"reason": "outage_grace"}); v != 0 {
		t.Errorf(`jobreaper_jobs_skipped_total{reason="outage_grace"} = %v before any pass, want 0`, v)
	}
}
