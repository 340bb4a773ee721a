package reaper

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/jobreaper/jobreaper/internal/failpoint"
	"github.com/jobreaper/jobreaper/jobs"
)

// LeaderLeaseStore is what the leader lease needs from PostgreSQL;
// *jobs.Store satisfies it.
type LeaderLeaseStore interface {
	AcquireLeaderLease(ctx context.Context, p jobs.LeaderLeaseParams) (jobs.LeaderLeaseState, error)
	ReleaseLeaderLease(ctx context.Context, key, holderID string) error
}

// Settings are the settings that decide a reap. The leader records them in
// its leader lease row; every replica of the same queue set compares its
// own with them at each attempt (settings drift, case B31).
type Settings struct {
	Interval            string   `json:"interval"`
	HeartbeatInterval   string   `json:"heartbeat_interval"`
	DefaultStallTimeout string   `json:"stall_timeout"`
	Queues              []string `json:"queues"`
	// Cascades is a digest of the cascades (CascadesDigest): the
	// statements themselves are long, and may name product tables.
	Cascades string `json:"cascades"`
}

// NewSettings returns the Settings of a daemon: durations as Go durations,
// the queues normalized like the leader lease key.
func NewSettings(interval, heartbeat, stall time.Duration, queues []string, cascades jobs.Cascades) Settings {
	q := slices.Clone(queues)
	slices.Sort(q)
	q = slices.Compact(q)
	if q == nil {
		q = []string{}
	}
	return Settings{Interval: interval.String(), HeartbeatInterval: heartbeat.String(),
		DefaultStallTimeout: stall.String(), Queues: q, Cascades: CascadesDigest(cascades)}
}

// CascadesDigest is the first 16 hex digits of the SHA-256 of the
// cascades' JSON form (types in name order): equal cascades give equal
// digests on every replica.
func CascadesDigest(c jobs.Cascades) string {
	if c == nil {
		c = jobs.Cascades{}
	}
	b, _ := json.Marshal(c) // maps marshal with sorted keys
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:8])
}

// drift returns one "setting: ours vs leader's" line per setting that
// differs between mine and theirs.
func (mine Settings) drift(theirs Settings) []string {
	var out []string
	add := func(name, a, b string) {
		if a != b {
			out = append(out, fmt.Sprintf("%s: this replica %s, the leader %s", name, a, b))
		}
	}
	add("interval", mine.Interval, theirs.Interval)
	add("heartbeat_interval", mine.HeartbeatInterval, theirs.HeartbeatInterval)
	add("stall_timeout", mine.DefaultStallTimeout, theirs.DefaultStallTimeout)
	add("queues", fmt.Sprint(mine.Queues), fmt.Sprint(theirs.Queues))
	add("cascades (digest)", mine.Cascades, theirs.Cascades)
	return out
}

// LeaderLease keeps one replica per queue set running passes: the daemon
// tries to take or renew its leader lease every Interval/3, the lease is
// valid for 1.5 Intervals from each renewal, so a leader that stops
// renewing (crash, partition, SIGSTOP) is replaced within two intervals
// of its last renewal (1.5 + 1/3), and never while its leader lease is
// valid. Build it with NewLeaderLease and give it to Options.LeaderLease.
type LeaderLease struct {
	store    LeaderLeaseStore
	key      string
	holder   jobs.LeaderLeaseHolder
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
	drifted    bool
	leading    bool
	// cutShort is true when the last attempt, made while the leader lease
	// was held, ended without an answer because the daemon was stopping
	// (or it panicked): the row may still be this replica's, so the
	// release says it released it.
	cutShort bool
}

// NewLeaderLease returns the leader lease of a daemon scanning queues
// every interval, held as holder, recording settings.
func NewLeaderLease(store LeaderLeaseStore, queues []string, holder jobs.LeaderLeaseHolder, interval time.Duration,
	settings Settings, log *slog.Logger, metrics *Metrics) *LeaderLease {
	raw, _ := json.Marshal(settings) // plain strings: always marshals
	if log == nil {
		log = slog.Default()
	}
	return &LeaderLease{
		store: store, key: jobs.LeaderLeaseKey(queues), holder: holder, settings: settings, raw: raw,
		ttl: max(interval*3/2, time.Second), every: max(interval/3, 100*time.Millisecond),
		log: log.With("component", "leader_lease", "key", jobs.LeaderLeaseKey(queues)), metrics: metrics,
	}
}

// Key is the leader lease's key (jobs.LeaderLeaseKey of the queues).
func (l *LeaderLease) Key() string { return l.key }

// Holder is this daemon's identity in the leader lease row.
func (l *LeaderLease) Holder() jobs.LeaderLeaseHolder { return l.holder }

// Held reports whether this daemon holds a valid leader lease by its own
// monotonic clock (see validUntil).
func (l *LeaderLease) Held() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return time.Now().Before(l.validUntil)
}

// Attempt takes or renews the leader lease once, compares the holder's
// settings with this daemon's, and updates the metrics. It returns whether
// this daemon holds the leader lease. An error (PostgreSQL unreachable)
// counts as not held: a leader that cannot renew stops reaping.
func (l *LeaderLease) Attempt(ctx context.Context) bool {
	failpoint.Inject("lease") // test builds only
	sent := time.Now()
	st, err := l.store.AcquireLeaderLease(ctx, jobs.LeaderLeaseParams{Key: l.key, Holder: l.holder, TTL: l.ttl, Settings: l.raw})
	l.mu.Lock()
	defer l.mu.Unlock()
	if err != nil {
		if ctx.Err() == nil {
			l.log.Warn("leader lease attempt failed; this replica runs no pass until one succeeds", "err", err)
		}
		l.validUntil = time.Time{}
		l.setLeading(false, st)
		return false
	}
	if st.Held {
		// The database's expiry is at least TTL after the attempt reached
		// it; counting from before the attempt was sent keeps this host's
		// view on the safe side.
		l.validUntil = sent.Add(l.ttl)
	} else {
		l.validUntil = time.Time{}
	}
	l.setLeading(st.Held, st)
	l.compareSettings(st)
	l.metrics.leaderLease(st.Held, st.Age().Seconds())
	return st.Held
}

// setLeading logs a change of leadership.
func (l *LeaderLease) setLeading(held bool, st jobs.LeaderLeaseState) {
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

// compareSettings checks the holder's recorded settings against this
// daemon's (B31): each difference is logged as an error, naming the
// setting and both values, and jobreaper_settings_drift is 1 until they
// agree again.
func (l *LeaderLease) compareSettings(st jobs.LeaderLeaseState) {
	if !st.Found || st.Held {
		l.setDrift(false, nil, st)
		return
	}
	var theirs Settings
	if err := json.Unmarshal(st.Settings, &theirs); err != nil {
		l.log.Error("the leader's recorded settings are unreadable; cannot compare", "leader", st.Holder.String(), "err", err)
		l.setDrift(true, nil, st)
		return
	}
	diffs := l.settings.drift(theirs)
	l.setDrift(len(diffs) > 0, diffs, st)
}

func (l *LeaderLease) setDrift(drifted bool, diffs []string, st jobs.LeaderLeaseState) {
	if drifted {
		// Logged at every attempt while it lasts: replicas that judge jobs
		// differently must not go unnoticed.
		l.log.Error("settings drift: this replica's settings that decide a reap differ from the leader's; "+
			"whichever replica leads decides differently", "leader", st.Holder.String(), "differences", diffs)
	} else if l.drifted {
		l.log.Info("settings drift resolved: this replica's settings match the leader's")
	}
	l.drifted = drifted
	l.metrics.settingsDrift(drifted)
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
	l.metrics.leaderLease(false, 0)
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
	l.metrics.leaderLease(false, 0)
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
