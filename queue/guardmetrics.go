package queue

import (
	"errors"
	"fmt"
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/jobreaper/jobreaper/jobs"
)

// decision is one value of jobreaper_guard_decisions_total's decision
// label. It is an index into decisionNames, so that every value the guard
// can count is in the table below: it exists at 0 from the start and is
// listed in the metric's help text.
type decision int

// The guard's decisions: the start decision of admit, then the outcome
// mapping's settlement of an attempt.
const (
	decisionClaimed decision = iota
	decisionRefusedReaped
	decisionRefusedFailed
	decisionAckedCompleted
	decisionClaimLost
	decisionNoRow
	decisionUnavailable
	decisionNoTaskID
	decisionBadJobID
	decisionBadMarker
	decisionCompleted
	decisionAutoCompleted
	decisionNoCompletion
	decisionReleased
	decisionFailed
	decisionAbandoned
	decisionLostJob
	decisionSettleFailed
	decisionCount // number of decisions; not a label value
)

// decisionNames are the label values, indexed by decision.
var decisionNames = [decisionCount]string{
	decisionClaimed:        "claimed",
	decisionRefusedReaped:  "refused_reaped",
	decisionRefusedFailed:  "refused_failed",
	decisionAckedCompleted: "acked_completed",
	decisionClaimLost:      "claim_lost",
	decisionNoRow:          "no_row",
	decisionUnavailable:    "unavailable",
	decisionNoTaskID:       "no_task_id",
	decisionBadJobID:       "bad_job_id",
	decisionBadMarker:      "bad_marker",
	decisionCompleted:      "completed",
	decisionAutoCompleted:  "auto_completed",
	decisionNoCompletion:   "no_completion",
	decisionReleased:       "released",
	decisionFailed:         "failed",
	decisionAbandoned:      "abandoned",
	decisionLostJob:        "lost_job",
	decisionSettleFailed:   "settle_failed",
}

func (d decision) String() string { return decisionNames[d] }

type guardMetrics struct {
	decisions     *prometheus.CounterVec
	shortDeadline *prometheus.CounterVec
}

// newGuardMetrics registers jobreaper_guard_decisions_total and
// jobreaper_guard_short_deadline_total with r, or shares the counters
// another Guard registered there, and creates the series of every
// decision at 0, so that a rate() or an alert on one works before its
// first occurrence. The short-deadline series are per job type, created
// at a type's first count.
func newGuardMetrics(r prometheus.Registerer) *guardMetrics {
	return &guardMetrics{
		decisions: registerShared(r, prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "jobreaper_guard_decisions_total",
			Help: "Tasks the start guard decided on and attempts it settled, by decision (" +
				strings.Join(decisionNames[:], ", ") + ").",
		}, []string{"decision"}), decisionNames[:]...),
		shortDeadline: registerShared(r, prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "jobreaper_guard_short_deadline_total",
			Help: "Claims whose task's deadline (asynq's Timeout or Deadline) ends before started_at + max_runtime + " +
				"stall timeout, so asynq cuts the attempt before the reaper could judge it, by job type.",
		}, []string{"type"})),
	}
}

// registerShared registers c with r, or returns the collector of the same
// description another Guard registered there, and creates the series of
// each of values (for a one-label vector) at 0.
func registerShared(r prometheus.Registerer, c *prometheus.CounterVec, values ...string) *prometheus.CounterVec {
	if err := r.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if !errors.As(err, &are) {
			panic(fmt.Sprintf("queue: registering the guard's metrics: %v", err))
		}
		c = are.ExistingCollector.(*prometheus.CounterVec)
	}
	for _, v := range values {
		c.WithLabelValues(v)
	}
	return c
}

func (g *Guard) count(d decision) {
	if g.metrics != nil {
		g.metrics.decisions.WithLabelValues(d.String()).Inc()
	}
}

// countShortDeadline counts a short-deadline claim of job type typ; a
// name jobs.CheckID refuses as an identifier (empty, invalid UTF-8, a NUL
// byte, over jobs.MaxIDLength bytes) counts under "".
func (g *Guard) countShortDeadline(typ string) {
	if g.metrics == nil {
		return
	}
	if jobs.CheckID(typ) != nil {
		typ = ""
	}
	g.metrics.shortDeadline.WithLabelValues(typ).Inc()
}
