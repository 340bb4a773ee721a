package reaper_test

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/jobreaper/jobreaper/internal/pgstore"
	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
	"github.com/jobreaper/jobreaper/reaper"
)

// leaseReplica is one daemon's leader lease and metrics, on a store of
// its own.
type leaseReplica struct {
	lease *reaper.LeaderLease
	reg   *prometheus.Registry
	log   *logBuffer
}

// leaseInterval is the replicas' scan interval: their leader lease is
// valid for 1.5 s from each renewal.
const leaseInterval = time.Second

func newLeaseReplica(t *testing.T, store reaper.LeaderLeaseStore, queues []string, settings reaper.Settings) leaseReplica {
	t.Helper()
	reg := prometheus.NewRegistry()
	log := &logBuffer{}
	l := reaper.NewLeaderLease(store, queues, pgstore.NewLeaderLeaseHolder(time.Now()), leaseInterval, settings,
		slog.New(slog.NewTextHandler(log, nil)), reaper.NewMetrics(reg))
	return leaseReplica{l, reg, log}
}

func (r leaseReplica) leader(t *testing.T) float64 {
	return metricValue(t, r.reg, "jobreaper_leader", map[string]string{})
}

func (r leaseReplica) age(t *testing.T) float64 {
	return metricValue(t, r.reg, "jobreaper_leader_lease_age_seconds", map[string]string{})
}

// Across a takeover (the first holder stops renewing, the second attempts
// until it holds the leader lease), two replicas never both hold it by
// Held, the test every reap makes, nor both export jobreaper_leader 1.
// Each sample reads the new holder before the old one: a lease valid at
// the first read may lapse before the second, but one that starts
// before the first read cannot end before it.
func TestLeaderLeaseIsNeverHeldByTwoReplicasAcrossATakeover(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := jobstest.New(t)
	queues := []string{"reports"}
	settings := reaper.NewSettings(leaseInterval, 5*time.Minute, 15*time.Minute, queues, nil)
	r1, r2 := newLeaseReplica(t, db.Daemon(), queues, settings), newLeaseReplica(t, db.Daemon(), queues, settings)
	if !r1.lease.Attempt(ctx) || r1.leader(t) != 1 {
		t.Fatal("the first replica does not lead")
	}

	var stop atomic.Bool
	var heldBoth, gaugeBoth, heldSamples, gaugeSamples atomic.Int64
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		for !stop.Load() {
			second := r2.lease.Held()
			if r1.lease.Held() && second {
				heldBoth.Add(1)
			}
			heldSamples.Add(1)
		}
	}()
	go func() {
		defer wg.Done()
		for !stop.Load() {
			second := r2.leader(t)
			if r1.leader(t) == 1 && second == 1 {
				gaugeBoth.Add(1)
			}
			gaugeSamples.Add(1)
		}
	}()
	// The second replica attempts as a follower does (the first has
	// stopped renewing), and keeps renewing once it leads.
	deadline := time.Now().Add(30 * time.Second)
	for !r2.lease.Attempt(ctx) {
		if time.Now().After(deadline) {
			t.Fatal("the second replica never took the leader lease")
		}
		time.Sleep(20 * time.Millisecond)
	}
	for range 10 {
		time.Sleep(100 * time.Millisecond)
		r2.lease.Attempt(ctx)
		if r1.leader(t) != 0 || r2.leader(t) != 1 {
			t.Errorf("after the takeover jobreaper_leader is %v on the old leader and %v on the new one, want 0 and 1", r1.leader(t), r2.leader(t))
			break
		}
	}
	stop.Store(true)
	wg.Wait()
	if heldBoth.Load() != 0 || gaugeBoth.Load() != 0 {
		t.Fatalf("both replicas held the leader lease in %d of %d samples of Held and exported jobreaper_leader 1 in %d of %d scrapes",
			heldBoth.Load(), heldSamples.Load(), gaugeBoth.Load(), gaugeSamples.Load())
	}
	if heldSamples.Load() < 1000 || gaugeSamples.Load() < 100 {
		t.Fatalf("only %d samples of Held and %d scrapes across the takeover", heldSamples.Load(), gaugeSamples.Load())
	}
}

// TestCase_B44_ALeaderCutOffFromPostgreSQLStopsSayingItLeads: R1 leads;
// its PostgreSQL becomes unreachable (its pool is closed); R2 takes the
// leader lease after the TTL. R1 exports jobreaper_leader 0 from its
// first failed renewal, its lease age keeps growing past two intervals
// (the "no leader" alert), and at every scrape after the takeover exactly
// one replica exports 1.
func TestCase_B44_ALeaderCutOffFromPostgreSQLStopsSayingItLeads(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := jobstest.New(t)
	pool1, err := jobs.Connect(ctx, db.URL, db.Schema)
	if err != nil {
		t.Fatal(err)
	}
	defer pool1.Close()
	queues := []string{"exports"}
	settings := reaper.NewSettings(leaseInterval, 5*time.Minute, 15*time.Minute, queues, nil)
	r1 := newLeaseReplica(t, pgstore.New(pool1, pgstore.WithSchema(db.Schema)), queues, settings)
	r2 := newLeaseReplica(t, db.Daemon(), queues, settings)
	if !r1.lease.Attempt(ctx) || r1.leader(t) != 1 {
		t.Fatal("R1 does not lead")
	}
	if r2.lease.Attempt(ctx) || r2.leader(t) != 0 {
		t.Fatal("R2 leads beside R1")
	}
	if a := r1.age(t); a < 0 || a > 1 {
		t.Fatalf("R1's lease age just after its renewal = %vs", a)
	}

	pool1.Close()
	if r1.lease.Attempt(ctx) {
		t.Fatal("R1's renewal succeeded on a closed pool")
	}
	if r1.leader(t) != 0 {
		t.Fatalf("R1 exports jobreaper_leader %v after its first failed renewal, want 0", r1.leader(t))
	}
	first := r1.age(t)
	jobstest.Eventually(t, "R1's lease age grows past two intervals", func() bool {
		r1.lease.Attempt(ctx)
		return r1.age(t) > 2*leaseInterval.Seconds()
	})
	if later := r1.age(t); later <= first {
		t.Fatalf("R1's lease age went from %vs to %vs while it could not renew", first, later)
	}

	jobstest.Eventually(t, "R2 takes the leader lease", func() bool { return r2.lease.Attempt(ctx) })
	for range 10 {
		r1.lease.Attempt(ctx)
		r2.lease.Attempt(ctx)
		if r1.leader(t)+r2.leader(t) != 1 || r2.leader(t) != 1 {
			t.Fatalf("after the takeover jobreaper_leader is %v on R1 and %v on R2, want 0 and 1", r1.leader(t), r2.leader(t))
		}
		if a := r2.age(t); a > leaseInterval.Seconds() {
			t.Fatalf("R2's lease age just after its renewal = %vs", a)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if r1.age(t) <= 2*leaseInterval.Seconds() {
		t.Fatalf("R1's lease age fell back to %vs while it still cannot read the lease", r1.age(t))
	}
}

// A replica run with --leader-lease=false exports jobreaper_leader 1 and
// no lease age, as before.
func TestLeaderGaugeWithoutALeaderLease(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	m := reaper.NewMetrics(reg)
	if v := metricValue(t, reg, "jobreaper_leader", map[string]string{}); v != 0 {
		t.Fatalf("jobreaper_leader before anything = %v, want 0", v)
	}
	m.SetLeaderWithoutLease()
	if v := metricValue(t, reg, "jobreaper_leader", map[string]string{}); v != 1 {
		t.Fatalf("jobreaper_leader with --leader-lease=false = %v, want 1", v)
	}
	if v := metricValue(t, reg, "jobreaper_leader_lease_age_seconds", map[string]string{}); v != 0 {
		t.Fatalf("jobreaper_leader_lease_age_seconds with --leader-lease=false = %v, want 0", v)
	}
}
