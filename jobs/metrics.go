package jobs

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// Kinds of jobreaper_late_results_refused_total: what the refused late
// write of an attempt would have done.
const (
	// LateComplete: Complete, CompleteWith, AutoComplete, CheckCompleted.
	LateComplete = "complete"
	// LateAdvance: Advance and SetTotal (resumable progress).
	LateAdvance = "advance"
	// LateHeartbeat: Heartbeat, including calls the Heartbeater answers
	// from the attempt's recorded refusal without a round trip.
	LateHeartbeat = "heartbeat"
	// LateFail: Fail and Release (the attempt ending without success).
	LateFail = "fail"
)

// Results of jobreaper_heartbeat_calls_total.
const (
	// HeartbeatWritten: the heartbeat moved updated_at and the mark.
	HeartbeatWritten = "written"
	// HeartbeatThrottled: the limiter let no statement through.
	HeartbeatThrottled = "throttled"
	// HeartbeatUnchanged: sent, but the mark had not advanced, so nothing
	// moved (an idle ticker).
	HeartbeatUnchanged = "unchanged"
)

// lateKinds maps the refused operation (LateResultDetail.Operation) to its
// kind label.
var lateKinds = map[string]string{
	"Complete": LateComplete, "AutoComplete": LateComplete, "CheckCompleted": LateComplete,
	"Advance": LateAdvance, "SetTotal": LateAdvance,
	"Heartbeat": LateHeartbeat,
	"Fail":      LateFail, "Release": LateFail,
}

// Outcomes of jobreaper_job_runtime_seconds: how the attempt ended.
const (
	outcomeCompleted = "completed"
	outcomeFailed    = "failed"
)

// runtimeBuckets are the buckets of jobreaper_job_runtime_seconds:
// 1 s doubling to 131,072 s (about 36 hours), so that jobs of minutes and
// jobs of hours both fall into buckets a few of their own runtimes wide,
// past the default hard_timeout of 24 hours. The daemon's
// jobreaper_reap_delay_seconds uses the same ones.
var runtimeBuckets = prometheus.ExponentialBuckets(1, 2, 18)

// workerMetrics are the worker library's own series (WithRegisterer).
type workerMetrics struct {
	late       *prometheus.CounterVec
	heartbeats *prometheus.CounterVec
	runtime    *prometheus.HistogramVec
}

// WithRegisterer registers the worker library's metrics with r (default:
// none), every label value at 0 from the start:
//
//   - jobreaper_late_results_refused_total{kind}: fenced writes refused
//     because the attempt was superseded or the job had ended; kind is
//     complete, advance, heartbeat or fail.
//   - jobreaper_heartbeat_calls_total{result}: Heartbeat calls of the
//     Heartbeaters over this Store, by result: written, throttled,
//     unchanged (refused calls count as late results; calls that fail are
//     in neither).
//   - jobreaper_job_runtime_seconds{type,outcome}: a histogram of the
//     runtime (database time from the claim to the final write) of the
//     attempts this Store ended, by job type and outcome: completed
//     (Complete, CompleteWith, AutoComplete) or failed (Fail). Buckets
//     from 1 s to about 36 h. A type name that no label value can hold
//     counts as "(invalid)". Complete observes when its UPDATE matched
//     (the caller commits); the others once they committed.
//
// Stores registering on the same r share the counters. It panics, like
// prometheus.MustRegister, when r refuses a counter for another reason.
func WithRegisterer(r prometheus.Registerer) StoreOption {
	return func(s *Store) {
		if r == nil {
			return
		}
		s.metrics = &workerMetrics{
			late: registerCounterVec(r, prometheus.CounterOpts{
				Name: "jobreaper_late_results_refused_total",
				Help: "Late writes of superseded or ended attempts that the fence refused, by kind (complete, advance, heartbeat, fail).",
			}, "kind", LateComplete, LateAdvance, LateHeartbeat, LateFail),
			heartbeats: registerCounterVec(r, prometheus.CounterOpts{
				Name: "jobreaper_heartbeat_calls_total",
				Help: "Heartbeat calls by result: written (moved the job), throttled (no statement sent), unchanged (sent, the mark had not advanced).",
			}, "result", HeartbeatWritten, HeartbeatThrottled, HeartbeatUnchanged),
			runtime: registerHistogramVec(r, prometheus.HistogramOpts{
				Name: "jobreaper_job_runtime_seconds",
				Help: "Runtime in seconds (database time from the claim to the final write) of the attempts the worker library ended, " +
					"by job type and outcome (completed, failed).",
				Buckets: runtimeBuckets,
			}, "type", "outcome"),
		}
	}
}

// registerCounterVec registers a counter vector with one label, or shares
// the one already registered on r, and creates every value's series at 0.
func registerCounterVec(r prometheus.Registerer, opts prometheus.CounterOpts, label string, values ...string) *prometheus.CounterVec {
	c := prometheus.NewCounterVec(opts, []string{label})
	if err := r.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if !errors.As(err, &are) {
			panic(fmt.Sprintf("jobs: registering %s: %v", opts.Name, err))
		}
		c = are.ExistingCollector.(*prometheus.CounterVec)
	}
	for _, v := range values {
		c.WithLabelValues(v)
	}
	return c
}

// registerHistogramVec registers a histogram vector, or shares the one
// already registered on r.
func registerHistogramVec(r prometheus.Registerer, opts prometheus.HistogramOpts, labels ...string) *prometheus.HistogramVec {
	h := prometheus.NewHistogramVec(opts, labels)
	if err := r.Register(h); err != nil {
		var are prometheus.AlreadyRegisteredError
		if !errors.As(err, &are) {
			panic(fmt.Sprintf("jobs: registering %s: %v", opts.Name, err))
		}
		h = are.ExistingCollector.(*prometheus.HistogramVec)
	}
	return h
}

// finished observes the runtime of an attempt a final write ended; an
// attempt whose row held no start time is not observed.
func (m *workerMetrics) finished(f finishedAttempt) {
	if m == nil || f.ev.RuntimeSeconds == nil {
		return
	}
	m.runtime.WithLabelValues(labelValue(f.typ), f.outcome).Observe(*f.ev.RuntimeSeconds)
}

// lateRefused counts a refused late write of operation op.
func (m *workerMetrics) lateRefused(op string) {
	if m == nil {
		return
	}
	if kind, ok := lateKinds[op]; ok {
		m.late.WithLabelValues(kind).Inc()
	}
}

// heartbeat counts a heartbeat call's result.
func (m *workerMetrics) heartbeat(result string) {
	if m != nil {
		m.heartbeats.WithLabelValues(result).Inc()
	}
}
