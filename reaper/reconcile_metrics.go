package reaper

import (
	"github.com/prometheus/client_golang/prometheus"
)

// reconcileMetrics are the series of the reconciliation between the jobs
// table and asynq: what the pass reports beyond reaps (Redis's eviction
// policy, stale QUEUED rows, broken active entries, the mass-loss limit).
type reconcileMetrics struct {
	evictionUnsafe prometheus.Gauge
}

func newReconcileMetrics(reg prometheus.Registerer) *reconcileMetrics {
	m := &reconcileMetrics{
		evictionUnsafe: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "jobreaper_redis_eviction_policy_unsafe",
			Help: "1 when Redis's maxmemory-policy is not noeviction, so it may evict markers under memory pressure; 0 when it is, or when it cannot be read (see the log).",
		}),
	}
	reg.MustRegister(m.evictionUnsafe)
	return m
}

// The methods below accept a nil *Metrics.

func (m *Metrics) evictionPolicy(unsafe bool) {
	if m == nil {
		return
	}
	v := 0.0
	if unsafe {
		v = 1
	}
	m.reconcile.evictionUnsafe.Set(v)
}
