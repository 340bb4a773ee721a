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

// workerMetrics are the worker library's own series (WithRegisterer).
type workerMetrics struct {
	late       *prometheus.CounterVec
	heartbeats *prometheus.CounterVec
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
