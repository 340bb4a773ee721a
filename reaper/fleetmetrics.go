package reaper

import (
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// fleetMetrics are the series of a daemon running as one of several
// replicas: its leader lease, settings drift, and the cancels it sends.
//
// jobreaper_leader and jobreaper_leader_lease_age_seconds are computed at
// each scrape from the leader lease itself, never from the outcome of its
// last attempt: a replica whose renewals fail, or whose validity lapsed
// while it was paused, exports 0 at once, and the age keeps growing while
// nobody renews. Their names are a contract (dashboard, alerts).
type fleetMetrics struct {
	// lease is the leader lease the two gauges read; nil without one.
	lease atomic.Pointer[LeaderLease]
	// withoutLease is set for a replica that runs every pass
	// (--leader-lease=false): it leads by construction.
	withoutLease atomic.Bool
	// gaveUp is set when the daemon runs no more passes (it gave up after
	// panicked passes): it leads no more, with or without a leader lease.
	gaveUp  atomic.Bool
	drift   prometheus.Gauge
	cancels prometheus.Counter
}

func newFleetMetrics(reg prometheus.Registerer) *fleetMetrics {
	m := &fleetMetrics{
		drift: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "jobreaper_settings_drift",
			Help: "1 while this replica's settings that decide what the leader does (interval, heartbeat interval, stall timeout, queues, cascades, the Redis it reads, max_lost_per_pass, stale QUEUED thresholds, cancel on reap, the stall-storm limits and hold) differ from its leader's; the log names each.",
		}),
		cancels: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "jobreaper_cancels_sent_total",
			Help: "asynq cancels published for the running handlers of reaped jobs (cancel on reap).",
		}),
	}
	leader := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "jobreaper_leader",
		Help: "1 when this replica runs passes: it holds the leader lease of its queue set now (the test every reap makes: its last successful attempt's validity has not run out on this host's clock), or runs without one; else 0.",
	}, m.leading)
	leaseAge := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "jobreaper_leader_lease_age_seconds",
		Help: "Seconds since the leader lease of this replica's queue set was last renewed: its age on the database clock at this replica's last successful attempt, plus the time since on this host's clock, so it keeps growing while attempts fail; alert when min over the set passes two intervals (no leader).",
	}, m.leaseAgeSeconds)
	reg.MustRegister(leader, leaseAge, m.drift, m.cancels)
	return m
}

// leading is jobreaper_leader's value now.
func (m *fleetMetrics) leading() float64 {
	if m.gaveUp.Load() {
		return 0
	}
	if m.withoutLease.Load() {
		return 1
	}
	if l := m.lease.Load(); l != nil {
		return boolFloat(l.Held())
	}
	return 0
}

// runsNoPasses reports whether this replica runs no passes now: it gave
// up, or it has a leader lease that it does not hold. Without a leader
// lease (run --once, a test's RunOnce, --leader-lease=false) it runs them.
func (m *fleetMetrics) runsNoPasses() bool {
	if m.gaveUp.Load() {
		return true
	}
	l := m.lease.Load()
	return l != nil && !l.Held()
}

// leaseAgeSeconds is jobreaper_leader_lease_age_seconds's value now; 0
// without a leader lease.
func (m *fleetMetrics) leaseAgeSeconds() float64 {
	if l := m.lease.Load(); l != nil {
		return l.age().Seconds()
	}
	return 0
}

// watchLeaderLease makes jobreaper_leader and the lease age read l.
func (m *Metrics) watchLeaderLease(l *LeaderLease) {
	if m != nil {
		m.fleet.lease.Store(l)
	}
}

// notLeading sets jobreaper_leader to 0: the daemon runs no more passes
// (it gave up after panicked passes), with or without a leader lease.
func (m *Metrics) notLeading() {
	if m != nil {
		m.fleet.gaveUp.Store(true)
	}
}

// SetLeaderWithoutLease marks a replica that runs every pass
// (--leader-lease=false) as leading: jobreaper_leader is 1 from then on.
func (m *Metrics) SetLeaderWithoutLease() {
	if m != nil {
		m.fleet.withoutLease.Store(true)
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
