package reaper

import (
	"context"
	"encoding/json"
	"log/slog"
	"sync"
	"time"

	"github.com/jobreaper/jobreaper/internal/failpoint"
	"github.com/jobreaper/jobreaper/internal/pgstore"
)

// LeaderLeaseStore is what the leader lease needs from PostgreSQL;
// *pgstore.Store satisfies it.
type LeaderLeaseStore interface {
	AcquireLeaderLease(ctx context.Context, p pgstore.LeaderLeaseParams) (pgstore.LeaderLeaseState, error)
	ReleaseLeaderLease(ctx context.Context, key, holderID string) error
}

// LeaderLease keeps one replica per queue set running passes: the daemon
// tries to take or renew its leader lease every Interval/3, the lease is
// valid for 1.5 Intervals from each renewal, so a leader that stops
// renewing (crash, partition, SIGSTOP) is replaced within two intervals
// of its last renewal (1.5 + 1/3), and never while its leader lease is
// valid. A leader stopped inside a reap transaction, between its leader
// lease check and COMMIT, holds the lease row locked until PostgreSQL ends
// its idle session, one TTL later (pgstore.WithLeaderLeaseTTL): it is then
// replaced within 3.5 intervals of its last renewal. Build it with
// NewLeaderLease and give it to Options.LeaderLease.
type LeaderLease struct {
	store    LeaderLeaseStore
	key      string
	holder   pgstore.LeaderLeaseHolder
	settings Settings
	raw      json.RawMessage
	ttl      time.Duration
	every    time.Duration
	log      *slog.Logger
	metrics  *Metrics

	mu sync.Mutex
	// validUntil is, on this host's monotonic clock, when the leader lease
	// taken by the last successful attempt expires at the latest (measured
	// from before the attempt was sent); zero when not held. A process
	// that was paused past it (SIGSTOP) sees it has passed and starts no
	// reap until an attempt holds the leader lease again.
	validUntil time.Time
	// seenAge is the leader lease row's age (its database clock reading
	// minus renewed_at) as the last successful attempt read it, and seenAt
	// when, on this host's monotonic clock, that attempt returned (before
	// any, when the LeaderLease was built, with seenAge 0). The age now is
	// seenAge plus the time since seenAt: it keeps growing while attempts
	// fail (jobreaper_leader_lease_age_seconds).
	seenAge time.Duration
	seenAt  time.Time
	drift   driftState
	leading bool
	// failWarned and failMsg are when the last failed attempt was logged
	// at WARN and its error: while attempts keep failing with the same
	// error, one WARN a minute, the rest at DEBUG.
	failWarned time.Time
	failMsg    string
	// now is the clock of the drift log's repetition (time.Now; tests
	// move it).
	now func() time.Time
	// cutShort is true when the last attempt, made while the leader lease
	// was held, ended without an answer because the daemon was stopping
	// (or it panicked): the row may still be this replica's, so the
	// release says it released it.
	cutShort bool
}

// NewLeaderLease returns the leader lease of a daemon scanning queues
// every interval, held as holder, recording settings.
func NewLeaderLease(store LeaderLeaseStore, queues []string, holder pgstore.LeaderLeaseHolder, interval time.Duration,
	settings Settings, log *slog.Logger, metrics *Metrics) *LeaderLease {
	raw, _ := json.Marshal(settings) // strings, numbers and booleans: always marshals
	if log == nil {
		log = slog.Default()
	}
	l := &LeaderLease{
		store: store, key: pgstore.LeaderLeaseKey(queues), holder: holder, settings: settings, raw: raw,
		ttl: LeaderLeaseTTL(interval), every: max(interval/3, 100*time.Millisecond),
		log: log.With("component", "leader_lease", "key", pgstore.LeaderLeaseKey(queues)), metrics: metrics,
		seenAt: time.Now(), now: time.Now,
	}
	metrics.watchLeaderLease(l)
	return l
}

// LeaderLeaseTTL is how long the leader lease of a daemon scanning every
// interval stays valid from each renewal: 1.5 intervals, at least one
// second (the shortest TTL pgstore.Store.AcquireLeaderLease accepts). The Store that
// runs the daemon's reaps takes it too (pgstore.WithLeaderLeaseTTL), to bound
// how long a reap transaction may sit idle holding the leader lease row.
func LeaderLeaseTTL(interval time.Duration) time.Duration {
	return max(interval*3/2, time.Second)
}

// Key is the leader lease's key (pgstore.LeaderLeaseKey of the queues).
func (l *LeaderLease) Key() string { return l.key }

// Holder is this daemon's identity in the leader lease row.
func (l *LeaderLease) Holder() pgstore.LeaderLeaseHolder { return l.holder }

// Held reports whether this daemon holds a valid leader lease by its own
// monotonic clock (see validUntil). Every reap starts only when it
// reports true, and jobreaper_leader reads it at every scrape. Two
// replicas never hold it at the same instant (their clocks running at the
// same rate): a validity runs from before the attempt was sent, so it ends
// before the database lets another replica take the leader lease.
func (l *LeaderLease) Held() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return time.Now().Before(l.validUntil)
}

// age is how long ago the leader lease was last renewed, as far as this
// daemon knows (see seenAge).
func (l *LeaderLease) age() time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.seenAge + time.Since(l.seenAt)
}

// leaseFailRepeat is how often a leader lease attempt that keeps failing
// with the same error is logged at WARN again.
const leaseFailRepeat = time.Minute

// Attempt takes or renews the leader lease once, compares the holder's
// settings with this daemon's, and records the lease row's age. It returns
// whether this daemon holds the leader lease. An error (PostgreSQL
// unreachable) counts as not held: a leader that cannot renew stops
// reaping, and exports jobreaper_leader 0 from then on.
func (l *LeaderLease) Attempt(ctx context.Context) bool {
	failpoint.Inject("lease") // test builds only
	sent := time.Now()
	st, err := l.store.AcquireLeaderLease(ctx, pgstore.LeaderLeaseParams{Key: l.key, Holder: l.holder, TTL: l.ttl, Settings: l.raw})
	l.mu.Lock()
	defer l.mu.Unlock()
	if err != nil {
		if ctx.Err() == nil {
			level, now := slog.LevelDebug, l.now()
			if msg := err.Error(); msg != l.failMsg || now.Sub(l.failWarned) >= leaseFailRepeat {
				level, l.failMsg, l.failWarned = slog.LevelWarn, msg, now
			}
			l.log.Log(ctx, level, "leader lease attempt failed; this replica runs no pass until one succeeds", "err", err)
		}
		l.validUntil = time.Time{}
		l.setLeading(false, st)
		return false
	}
	l.failMsg = ""
	if st.Held {
		// The database's expiry is at least TTL after the attempt reached
		// it; counting from before the attempt was sent keeps this host's
		// view on the safe side.
		l.validUntil = sent.Add(l.ttl)
	} else {
		l.validUntil = time.Time{}
	}
	if st.Found {
		l.seenAge, l.seenAt = st.Age(), time.Now()
	}
	l.setLeading(st.Held, st)
	l.compareSettings(st)
	return st.Held
}

// setLeading logs a change of leadership.
func (l *LeaderLease) setLeading(held bool, st pgstore.LeaderLeaseState) {
	if held == l.leading {
		return
	}
	l.leading = held
	if held {
		l.log.Info("this replica took the leader lease and runs passes", "holder", l.holder.String())
		return
	}
	holder := "nobody"
	if st.Found {
		holder = st.Holder.String()
	}
	l.log.Info("this replica does not hold the leader lease; it runs no pass", "leader", holder)
}

// attempt is Attempt with its panic recovered, logged once at ERROR
// with its stack and returned: the leader lease then counts as not held
// (no reap may rely on an attempt that did not finish), and the row, if
// this replica still holds it, lapses at its expiry or is deleted by the
// release.
func (l *LeaderLease) attempt(ctx context.Context) (held bool, p *recovered) {
	was := l.Held()
	p = contain(func() { held = l.Attempt(ctx) })
	l.mu.Lock()
	l.cutShort = was && !held && (ctx.Err() != nil || p != nil)
	if p != nil {
		l.validUntil, l.leading = time.Time{}, false
	}
	l.mu.Unlock()
	if p == nil {
		return held, nil
	}
	logPanic(l.log, "leader lease attempt panicked; it was recovered, and this replica counts as not holding the leader lease", p)
	return false, p
}

// run attempts every l.every until ctx is done, calling lost when a
// previously held leader lease is no longer held (so a running pass
// stops). An attempt that failed because ctx was done (SIGTERM, Stop)
// lost nothing: the pass is stopped by the same ctx, and the release
// follows. An attempt that panicked is logged and counted, and the
// renewals go on.
func (l *LeaderLease) run(ctx context.Context, lost func()) {
	t := time.NewTicker(l.every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		was := l.Held()
		held, p := l.attempt(ctx)
		if p != nil {
			l.metrics.CountPanic()
		}
		if !held && was && ctx.Err() == nil {
			lost()
		}
	}
}

// release gives the leader lease up on a clean exit, so another replica
// takes over at its next attempt instead of at the expiry. The
// holder-conditional DELETE is sent whether or not this replica thinks it
// holds the lease: an attempt cut short by the stop (SIGTERM during its
// statement) may have renewed the row while reporting a failure, and the
// DELETE changes nothing when another replica holds it.
func (l *LeaderLease) release(ctx context.Context) {
	l.mu.Lock()
	held := time.Now().Before(l.validUntil) || l.cutShort
	l.validUntil, l.leading, l.cutShort = time.Time{}, false, false
	l.mu.Unlock()
	if err := l.store.ReleaseLeaderLease(ctx, l.key, l.holder.ID); err != nil {
		l.log.Warn("releasing the leader lease failed; another replica takes it when it expires", "err", err)
		return
	}
	if held {
		l.log.Info("leader lease released")
		return
	}
	l.log.Debug("leader lease row of this replica deleted, if there was one")
}
