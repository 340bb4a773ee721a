package reaper

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/jobreaper/jobreaper/jobs"
)

// Metrics are the reaper's Prometheus series. Build them with NewMetrics on
// the registry the daemon serves; tests use a fresh prometheus.NewRegistry.
type Metrics struct {
	passes        *prometheus.CounterVec
	scanned       prometheus.Counter
	reaped        *prometheus.CounterVec
	retried       *prometheus.CounterVec
	retryFinished *prometheus.CounterVec
	skipped       *prometheus.CounterVec
	errors        *prometheus.CounterVec
	markersFailed prometheus.Counter
	markersFixed  *prometheus.CounterVec
	queueNotFound *prometheus.CounterVec
	badQueues     prometheus.Gauge
	duration      prometheus.Histogram
	lastSuccess   prometheus.Gauge
	stallStorms   prometheus.Counter
	stormHeld     prometheus.Gauge
	atRisk        *atRiskGauge
	reapDelay     *prometheus.HistogramVec
	reconcile     *reconcileMetrics
	fleet         *fleetMetrics
}

// Error stages label jobreaper_pass_errors_total.
const (
	stageClock  = "clock"
	stageQueues = "queues"
	stageList   = "list"
	stageLoad   = "load"
	stageReap   = "reap"
	stageMarker = "marker"
)

// Pass outcomes label jobreaper_passes_total.
const (
	outcomeOK        = "ok"
	outcomeErrors    = "errors"
	outcomeFailed    = "failed"
	outcomeCancelled = "cancelled"
	outcomePanicked  = "panicked"
)

// NewMetrics creates the reaper's metrics and registers them with reg. It
// panics if they are already registered there (a programming error, as
// with prometheus.MustRegister).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		passes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "jobreaper_passes_total",
			Help: "Reaper passes by outcome: ok (no errors), errors (ran with errors), failed (could not run), cancelled (stopped before it finished, by a shutdown), " +
				"panicked (a pass, or the daemon's leader lease renewal or readiness check, panicked: recovered and logged with its stack).",
		}, []string{"outcome"}),
		scanned: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "jobreaper_tasks_scanned_total",
			Help: "Active asynq tasks listed by reaper passes.",
		}),
		reaped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "jobreaper_jobs_reaped_total",
			Help: "Jobs failed by the reaper, by failure reason (stalled, lost_task), job type and queue. The reason series with empty type and queue exist at 0 from the start; a type/queue pair appears at its first reap.",
		}, []string{"reason", "type", "queue"}),
		retried: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "jobreaper_jobs_retried_after_reap_total",
			Help: "Reaps that were retries (the job put back to QUEUED to run again within its type's reap_retries), by reason (stalled, lost_task), job type and queue; each is counted in jobreaper_jobs_reaped_total too.",
		}, []string{"reason", "type", "queue"}),
		retryFinished: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "jobreaper_reap_retries_finished_total",
			Help: "Retry-reaped jobs asynq had stranded that a later pass finished, by action: reenqueued (task archived or completed, replaced), cancel_resent (still active, cancelled again), failed_impossible (no task, failed with reap_retry_impossible).",
		}, []string{"action"}),
		skipped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "jobreaper_jobs_skipped_total",
			Help: "Listed tasks the reaper left alone, by skip reason.",
		}, []string{"reason"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "jobreaper_pass_errors_total",
			Help: "Errors inside reaper passes, by stage: clock, queues, list (asynq lists and lookups), load (database reads), reap, marker (marker writes).",
		}, []string{"stage"}),
		markersFailed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "jobreaper_markers_failed_total",
			Help: "Marker writes that failed, at the reap or in a later pass's repair (the FAILED row still guards); database reads that fail are counted in jobreaper_pass_errors_total only.",
		}),
		markersFixed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "jobreaper_markers_repaired_total",
			Help: "Markers re-set by a later pass, by cause: write_failed (the write at the reap failed) or lost (written, then lost to a failover, an eviction or a delete).",
		}, []string{"cause"}),
		queueNotFound: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "jobreaper_queue_not_found_total",
			Help: "Configured queues asynq has never seen (treated as empty; check for a typo).",
		}, []string{"queue"}),
		badQueues: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "jobreaper_bad_queue_names",
			Help: "Queue names the last pass skipped because no PostgreSQL text value or metric label can hold them (a NUL byte, invalid UTF-8, over 1,024 bytes): another client writes asynq:queues.",
		}),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "jobreaper_scan_duration_seconds",
			Help:    "Duration of reaper passes in seconds.",
			Buckets: prometheus.ExponentialBuckets(0.005, 2, 14),
		}),
		lastSuccess: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "jobreaper_last_success_timestamp_seconds",
			Help: "Unix time of the last pass that ran to its end without errors; alert when it stops moving.",
		}),
		stallStorms: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "jobreaper_stall_storms_total",
			Help: "Stall-storm holds this replica started: passes that would have reaped more stalled jobs than max_stalled_per_pass, or more than max_stalled_fraction of the active tasks they judged, reaped none and held their queues (reaper_holds).",
		}),
		stormHeld: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "jobreaper_stall_storm_held",
			Help: "Stalled jobs the last pass did not reap because a stall-storm hold holds their queues (skip reason stall_storm_held).",
		}),
	}
	// Series of every known label value exist from the start at 0, so a
	// rate() or an alert on them works before the first occurrence.
	for _, o := range []string{outcomeOK, outcomeErrors, outcomeFailed, outcomeCancelled, outcomePanicked} {
		m.passes.WithLabelValues(o)
	}
	for _, st := range []string{stageClock, stageQueues, stageList, stageLoad, stageReap, stageMarker} {
		m.errors.WithLabelValues(st)
	}
	for _, reason := range []string{jobs.ReasonStalled, jobs.ReasonLostTask} {
		m.reaped.WithLabelValues(reason, "", "")
		m.retried.WithLabelValues(reason, "", "")
	}
	for _, reason := range []SkipReason{SkipNoRow, SkipNotProcessing, SkipBadRow, SkipNoStartTime, SkipUnknownType, SkipBadLimits,
		SkipWithinLimit, SkipProgressing, SkipNoJobID, SkipBadJobID, SkipChangedSinceRead, SkipAwaitingRetry, SkipQueueNotFound,
		SkipLostHeld, SkipNoQueue, SkipOutageGrace, SkipStallStormHeld} {
		m.skipped.WithLabelValues(string(reason))
	}
	for _, a := range []string{RetryReenqueued, RetryCancelResent, RetryFailedImpossible} {
		m.retryFinished.WithLabelValues(a)
	}
	for _, cause := range []string{causeWriteFailed, causeLost} {
		m.markersFixed.WithLabelValues(cause)
	}
	m.reconcile = newReconcileMetrics(reg)
	m.fleet = newFleetMetrics(reg)
	m.atRisk = newAtRiskGauge(m.fleet.runsNoPasses)
	m.reapDelay = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "jobreaper_reap_delay_seconds",
		Help: "How long each reaped job had been reapable when it was reaped, in seconds, by job type and reason (stalled, lost_task): " +
			"the lesser of its idle time beyond the stall timeout (counted from the last outage end) and its runtime beyond max_runtime.",
		Buckets: reapDelayBuckets,
	}, []string{"type", "reason"})
	reg.MustRegister(m.passes, m.scanned, m.reaped, m.retried, m.retryFinished, m.skipped, m.errors, m.markersFailed, m.markersFixed,
		m.queueNotFound, m.badQueues, m.duration, m.lastSuccess, m.stallStorms, m.stormHeld, m.atRisk, m.reapDelay)
	return m
}

// The methods below accept a nil *Metrics, so a Reaper without metrics needs
// no checks at every call site.

func (m *Metrics) errorAt(stage string) {
	if m != nil {
		m.errors.WithLabelValues(stage).Inc()
		if stage == stageMarker {
			m.markersFailed.Inc()
		}
	}
}

// Causes of a marker repair (jobreaper_markers_repaired_total{cause}).
const (
	causeWriteFailed = "write_failed"
	causeLost        = "lost"
)

func (m *Metrics) markerRepaired(cause string) {
	if m != nil {
		m.markersFixed.WithLabelValues(cause).Inc()
	}
}

func (m *Metrics) badQueueNames(n int) {
	if m != nil {
		m.badQueues.Set(float64(n))
	}
}

func (m *Metrics) queueMissing(queue string) {
	if m != nil {
		m.queueNotFound.WithLabelValues(queue).Inc()
	}
}

// pass records one pass that ended with outcome. Only an ok pass moves
// jobreaper_last_success_timestamp_seconds; a failed or panicked pass
// adds no counts.
func (m *Metrics) pass(res Result, seconds float64, outcome string, endUnix float64) {
	if m == nil {
		return
	}
	m.duration.Observe(seconds)
	m.passes.WithLabelValues(outcome).Inc()
	switch outcome {
	case outcomeFailed, outcomePanicked:
		return
	case outcomeOK:
		m.lastSuccess.Set(endUnix)
	}
	m.stormHeld.Set(float64(res.StallStormHeld))
	// A stopped pass did not judge every task: the gauge keeps the last
	// whole pass's jobs at risk.
	if outcome != outcomeCancelled {
		m.atRisk.set(res.atRiskSeries)
	}
	for _, d := range res.reapDelays {
		m.reapDelay.WithLabelValues(d.typ, d.reason).Observe(d.seconds)
	}
	m.scanned.Add(float64(res.Scanned))
	for reason, n := range res.Skipped {
		m.skipped.WithLabelValues(reason).Add(float64(n))
	}
	for k, n := range res.reapedSeries {
		m.reaped.WithLabelValues(k.reason, k.typ, k.queue).Add(float64(n))
	}
	for k, n := range res.retriedSeries {
		m.retried.WithLabelValues(k.reason, k.typ, k.queue).Add(float64(n))
	}
	for a, n := range res.RetriesFinished {
		if n > 0 {
			m.retryFinished.WithLabelValues(a).Add(float64(n))
		}
	}
}

// CountPanic counts a panic recovered outside a pass, in one of the
// daemon's background goroutines (the leader lease renewal, the readiness
// check), in jobreaper_passes_total{outcome="panicked"}, so that one alert
// on that series covers every panic of the daemon.
func (m *Metrics) CountPanic() {
	if m != nil {
		m.passes.WithLabelValues(outcomePanicked).Inc()
	}
}

func (m *Metrics) stallStorm() {
	if m != nil {
		m.stallStorms.Inc()
	}
}
