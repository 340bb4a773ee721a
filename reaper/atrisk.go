package reaper

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/jobreaper/jobreaper/internal/pgstore"
)

// AtRisk reports whether a job a pass judged with verdict v, and left
// alone, is at risk of being reaped soon: it is PROCESSING past its
// type's max_runtime (a skip as progressing, outage_grace or
// stall_storm_held, which Decide gives only to such jobs) and its idle
// time (now - updated_at) is at least half its stall timeout. Such a job
// is reaped once its idle time reaches the stall timeout (counted from
// the outage end, after a PostgreSQL outage) unless it records progress
// first: a live job that shows up here often has a stall timeout too
// short for its longest progress gap (jobs.max_idle_gap). A verdict to
// reap, and every other skip, is not at risk. It is pure: the pass's
// gauge jobreaper_jobs_at_risk, the dry run's decisions and any page
// that shows the jobs at risk use this one predicate.
func AtRisk(v Verdict) bool {
	if v.Reap {
		return false
	}
	switch v.Skip {
	case SkipProgressing, SkipOutageGrace, SkipStallStormHeld:
		// Idle >= ceil(StallTimeout / 2), without the overflow of 2 x Idle.
		return v.Runtime > v.MaxRuntime && v.Idle >= v.StallTimeout-v.StallTimeout/2
	}
	return false
}

// kindSeries labels one series of jobreaper_jobs_at_risk: a job type and
// a queue, each a label value (labelValue).
type kindSeries struct{ typ, queue string }

// atRisk counts a job of typ in queue (the row's, "" when NULL) that the
// pass left at risk (AtRisk).
func (r *Result) atRisk(typ, queue string) {
	r.AtRisk++
	if r.atRiskSeries == nil {
		r.atRiskSeries = map[kindSeries]int{}
	}
	r.atRiskSeries[kindSeries{labelValue(typ), labelValue(queue)}]++
}

// reapDelay is how long a reaped job had been reapable when it was
// reaped, on the database clock: the lesser of its idle time beyond the
// stall timeout and its runtime beyond max_runtime (it became reapable
// when the later of the two limits passed), idle time counted from the
// outage end when the reap counted it from there (Evidence.OutageEnd). It
// is never negative. Within one pass interval is the daemon working as
// designed; more means passes that failed, a hold, or no leader.
func reapDelay(ev pgstore.Evidence) time.Duration {
	idle := ev.Idle
	if ev.OutageEnd != nil {
		idle = ev.DBNow.Sub(*ev.OutageEnd)
	}
	return max(min(idle-ev.StallTimeout, ev.Runtime-ev.MaxRuntime), 0)
}

// delaySample is one reap's jobreaper_reap_delay_seconds observation.
type delaySample struct {
	typ, reason string
	seconds     float64
}

// reapDelayBuckets are jobreaper_reap_delay_seconds's buckets: 1 s
// doubling to 131,072 s (about 36 hours), the worker library's runtime
// buckets, since a reap delay runs from seconds (a pass interval) to
// hours (a long hold, or no leader for a night).
var reapDelayBuckets = prometheus.ExponentialBuckets(1, 2, 18)

// atRiskGauge is jobreaper_jobs_at_risk: the last pass's jobs at risk by
// type and queue. A series whose pair had none in the last pass is
// removed, so the set of series stays that of the jobs at risk now. It
// exports nothing while hide says this replica runs no passes (a
// follower without the leader lease, or a daemon that gave up), whose
// last pass's values would be stale and counted twice across replicas.
type atRiskGauge struct {
	vec  *prometheus.GaugeVec
	hide func() bool

	mu   sync.Mutex
	last map[kindSeries]bool
}

func newAtRiskGauge(hide func() bool) *atRiskGauge {
	return &atRiskGauge{
		vec: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "jobreaper_jobs_at_risk",
			Help: "Active jobs the last pass left PROCESSING past their type's max_runtime with an idle time of at least half their stall timeout, " +
				"by job type and queue: reaped within half a stall timeout unless they record progress. Only the replica that runs passes exports it.",
		}, []string{"type", "queue"}),
		hide: hide,
	}
}

// Describe implements prometheus.Collector.
func (g *atRiskGauge) Describe(ch chan<- *prometheus.Desc) { g.vec.Describe(ch) }

// Collect implements prometheus.Collector.
func (g *atRiskGauge) Collect(ch chan<- prometheus.Metric) {
	if g.hide() {
		return
	}
	g.vec.Collect(ch)
}

// set replaces the gauge's series with counts.
func (g *atRiskGauge) set(counts map[kindSeries]int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for k := range g.last {
		if _, ok := counts[k]; !ok {
			g.vec.DeleteLabelValues(k.typ, k.queue)
		}
	}
	g.last = make(map[kindSeries]bool, len(counts))
	for k, n := range counts {
		g.vec.WithLabelValues(k.typ, k.queue).Set(float64(n))
		g.last[k] = true
	}
}
