package reaper

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// reconcileMetrics are the series of the reconciliation between the jobs
// table and asynq: what the pass reports beyond reaps (Redis's eviction
// policy, stale QUEUED rows, broken active entries, the mass-loss limit).
type reconcileMetrics struct {
	evictionUnsafe   prometheus.Gauge
	staleQueued      *prometheus.GaugeVec
	brokenActive     *prometheus.GaugeVec
	lostLimitTripped prometheus.Counter
	uncovered        *prometheus.GaugeVec

	mu    sync.Mutex
	known map[*prometheus.GaugeVec]map[string]bool
}

func newReconcileMetrics(reg prometheus.Registerer) *reconcileMetrics {
	m := &reconcileMetrics{
		evictionUnsafe: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "jobreaper_redis_eviction_policy_unsafe",
			Help: "1 when Redis's maxmemory-policy is not noeviction, so it may evict markers under memory pressure; 0 when it is, or when it cannot be read (see the log).",
		}),
		staleQueued: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "jobreaper_stale_queued_jobs",
			Help: "QUEUED jobs older than stale_queued_after whose task asynq will never run (archived, completed or gone), by queue, as of the last complete look over them.",
		}, []string{"queue"}),
		brokenActive: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "jobreaper_broken_active_entries",
			Help: "Entries of asynq's active lists whose task hash is gone or that have no lease, by queue, as of the last pass that listed the queue.",
		}, []string{"queue"}),
		lostLimitTripped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "jobreaper_lost_limit_tripped_total",
			Help: "Cycles over the lost-task candidates that reaped none because more than max_lost_per_pass jobs would have been reaped as lost_task (Redis flushed or restored?).",
		}),
		uncovered: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "jobreaper_uncovered_processing_jobs",
			Help: "Stalled PROCESSING jobs in queues asynq knows that no live leader lease's queue set covers (no daemon scans them), by queue, as of this replica's last uncovered-queue check; only the leader whose queue set sorts first makes it. A queue covered again, or without stalled jobs, is 0.",
		}, []string{"queue"}),
	}
	reg.MustRegister(m.evictionUnsafe, m.staleQueued, m.brokenActive, m.lostLimitTripped, m.uncovered)
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

// staleQueuedCounts replaces the per-queue gauge with counts: queues not
// in counts drop to 0 rather than disappearing, so an alert sees them
// recover.
func (m *Metrics) staleQueuedCounts(counts map[string]int) {
	if m == nil {
		return
	}
	m.reconcile.setAll(m.reconcile.staleQueued, counts)
}

// brokenActiveCounts sets the gauge of each queue listed this pass.
func (m *Metrics) brokenActiveCounts(counts map[string]int) {
	if m == nil {
		return
	}
	for q, n := range counts {
		m.reconcile.brokenActive.WithLabelValues(q).Set(float64(n))
	}
}

// uncoveredCounts replaces jobreaper_uncovered_processing_jobs with
// counts: queues not in counts drop to 0 rather than disappearing, so an
// alert sees them recover.
func (m *Metrics) uncoveredCounts(counts map[string]int) {
	if m == nil {
		return
	}
	labelled := make(map[string]int, len(counts))
	for q, n := range counts {
		labelled[labelValue(q)] += n
	}
	m.reconcile.setAll(m.reconcile.uncovered, labelled)
}

func (m *Metrics) lostLimitTrip() {
	if m != nil {
		m.reconcile.lostLimitTripped.Inc()
	}
}

// setAll sets g to counts; every queue set before and missing from counts
// is put at 0 rather than dropped, so an alert sees it recover.
func (m *reconcileMetrics) setAll(g *prometheus.GaugeVec, counts map[string]int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.known == nil {
		m.known = map[*prometheus.GaugeVec]map[string]bool{}
	}
	known := m.known[g]
	if known == nil {
		known = map[string]bool{}
		m.known[g] = known
	}
	for q := range known {
		if _, ok := counts[q]; !ok {
			g.WithLabelValues(q).Set(0)
		}
	}
	for q, n := range counts {
		known[q] = true
		g.WithLabelValues(q).Set(float64(n))
	}
}
