package reaper

import "github.com/prometheus/client_golang/prometheus"

// fleetMetrics are the series of a daemon running as one of several
// replicas: its leader lease, settings drift, and the cancels it sends.
type fleetMetrics struct {
	leader   prometheus.Gauge
	leaseAge prometheus.Gauge
	drift    prometheus.Gauge
	cancels  prometheus.Counter
}

func newFleetMetrics(reg prometheus.Registerer) *fleetMetrics {
	m := &fleetMetrics{
		leader: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "jobreaper_leader",
			Help: "1 when this replica runs passes (it holds the leader lease of its queue set, or runs without one), else 0.",
		}),
		leaseAge: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "jobreaper_leader_lease_age_seconds",
			Help: "Seconds, on the database clock, since the leader lease of this replica's queue set was last renewed, as of this replica's last attempt; alert when it passes two intervals (no leader).",
		}),
		drift: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "jobreaper_settings_drift",
			Help: "1 when this replica's settings that decide a reap (interval, heartbeat interval, stall timeout, queues, cascades) differ from its leader's; the log names each.",
		}),
		cancels: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "jobreaper_cancels_sent_total",
			Help: "asynq cancels published for the running handlers of reaped jobs (cancel on reap).",
		}),
	}
	reg.MustRegister(m.leader, m.leaseAge, m.drift, m.cancels)
	return m
}

// leaderLease records an attempt's outcome.
func (m *Metrics) leaderLease(held bool, ageSeconds float64) {
	if m == nil {
		return
	}
	m.fleet.leader.Set(boolFloat(held))
	m.fleet.leaseAge.Set(ageSeconds)
}

// notLeading sets jobreaper_leader to 0: the daemon runs no more passes
// (it gave up after panicked passes), with or without a leader lease.
func (m *Metrics) notLeading() {
	if m != nil {
		m.fleet.leader.Set(0)
	}
}

// SetLeaderWithoutLease marks a replica that runs every pass
// (--leader-lease=false) as leading.
func (m *Metrics) SetLeaderWithoutLease() {
	if m != nil {
		m.fleet.leader.Set(1)
	}
}

func (m *Metrics) settingsDrift(drifted bool) {
	if m != nil {
		m.fleet.drift.Set(boolFloat(drifted))
	}
}

func (m *Metrics) cancelsSent(n int) {
	if m != nil {
		m.fleet.cancels.Add(float64(n))
	}
}

func boolFloat(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
