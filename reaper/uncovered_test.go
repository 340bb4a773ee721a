package reaper_test

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jobreaper/jobreaper/internal/asynqstate"
	"github.com/jobreaper/jobreaper/internal/pgstore"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
	"github.com/jobreaper/jobreaper/reaper"
)

// The comparison of the uncovered-queue check, as a pure function: the
// queues asynq knows, the leader lease rows with the database clock of
// their read, and the keys of a run's own queues.
func TestUncoveredQueues(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 3, 2, 9, 0, 0, 0, time.UTC)
	live := func(queues ...string) pgstore.LeaderLeaseRow {
		return pgstore.LeaderLeaseRow{Key: pgstore.LeaderLeaseKey(queues), HolderID: "h", ExpiresAt: now.Add(time.Second)}
	}
	expired := func(at time.Time, queues ...string) pgstore.LeaderLeaseRow {
		return pgstore.LeaderLeaseRow{Key: pgstore.LeaderLeaseKey(queues), HolderID: "h", ExpiresAt: at}
	}
	known := []string{"a", "b", "c", "d"}
	for _, tc := range []struct {
		name   string
		known  []string
		leases []pgstore.LeaderLeaseRow
		own    []string
		want   []string
	}{
		{"TwoSetsLeaveTheOtherQueues", known, []pgstore.LeaderLeaseRow{live("a"), live("b")}, nil, []string{"c", "d"}},
		{"ASetOfSeveralQueuesCoversEach", known, []pgstore.LeaderLeaseRow{live("d", "a", "b")}, nil, []string{"c"}},
		{"EveryQueueCoversAll", known, []pgstore.LeaderLeaseRow{live("a"), live()}, nil, nil},
		{"NoLeaseCoversNothing", known, nil, nil, known},
		{"AnExpiredLeaseCoversNothing", known, []pgstore.LeaderLeaseRow{live("a"), expired(now.Add(-time.Second), "b")}, nil,
			[]string{"b", "c", "d"}},
		{"ALeaseExpiringNowIsExpired", known, []pgstore.LeaderLeaseRow{expired(now, "a")}, nil, known},
		{"AnExpiredEveryQueueLeaseCoversNothing", known, []pgstore.LeaderLeaseRow{live("a"), expired(now.Add(-time.Hour))}, nil,
			[]string{"b", "c", "d"}},
		{"TheRunsOwnQueuesCount", known, []pgstore.LeaderLeaseRow{live("a")}, []string{pgstore.LeaderLeaseKey([]string{"c"})},
			[]string{"b", "d"}},
		{"ARunOfEveryQueueCoversAll", known, []pgstore.LeaderLeaseRow{live("a")}, []string{pgstore.LeaderLeaseKey(nil)}, nil},
		{"AKeyThatIsNoQueueSetCoversNothing", known, []pgstore.LeaderLeaseRow{{Key: "reports", ExpiresAt: now.Add(time.Hour)},
			{Key: "null", ExpiresAt: now.Add(time.Hour)}, live("a")}, nil, []string{"b", "c", "d"}},
		{"NamesComeOnceSortedAndUsable", []string{"d", "c\x00", "b", "d", "\xff"}, nil, nil, []string{"b", "d"}},
		{"NoQueueKnown", nil, nil, nil, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := reaper.UncoveredQueues(tc.known, pgstore.LeaderLeases{Rows: tc.leases, Now: now}, tc.own...)
			if !slices.Equal(got, tc.want) {
				t.Fatalf("UncoveredQueues = %q, want %q", got, tc.want)
			}
		})
	}
}

// The check is made by the holder of the live leader lease whose key
// sorts first in byte order: ["a"] before ["b"] before [] (a '"' sorts
// before ']'); an expired lease does not count, and a replica whose key
// sorts first but which does not hold it makes no check.
func TestChecksUncovered(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 3, 2, 9, 0, 0, 0, time.UTC)
	a, b, all := pgstore.LeaderLeaseKey([]string{"a"}), pgstore.LeaderLeaseKey([]string{"b"}), pgstore.LeaderLeaseKey(nil)
	ls := pgstore.LeaderLeases{Now: now, Rows: []pgstore.LeaderLeaseRow{
		{Key: all, HolderID: "hall", ExpiresAt: now.Add(time.Second)},
		{Key: b, HolderID: "hb", ExpiresAt: now.Add(time.Second)},
		{Key: a, HolderID: "ha", ExpiresAt: now.Add(time.Second)},
	}}
	for _, tc := range []struct {
		key, holder string
		want        bool
	}{{a, "ha", true}, {a, "someone else", false}, {b, "hb", false}, {all, "hall", false}} {
		if got := reaper.ChecksUncovered(ls, tc.key, tc.holder); got != tc.want {
			t.Errorf("ChecksUncovered(%s, %s) = %v, want %v", tc.key, tc.holder, got, tc.want)
		}
	}
	ls.Rows[2].ExpiresAt = now // a's lease expired: b's holder checks
	if !reaper.ChecksUncovered(ls, b, "hb") || reaper.ChecksUncovered(ls, a, "ha") {
		t.Error("with a's lease expired, b's holder does not make the check, or a's still does")
	}
	if reaper.ChecksUncovered(pgstore.LeaderLeases{Now: now}, a, "ha") {
		t.Error("with no lease at all, a replica makes the check")
	}
}

// uncoveredStore counts the uncovered-queue check's statements.
type uncoveredStore struct {
	*pgstore.Store
	leaseReads, counts atomic.Int32
}

func (s *uncoveredStore) ListLeaderLeases(ctx context.Context) (pgstore.LeaderLeases, error) {
	s.leaseReads.Add(1)
	return s.Store.ListLeaderLeases(ctx)
}

func (s *uncoveredStore) CountStalledByQueue(ctx context.Context, queues []string, rule pgstore.StallRule) (map[string]int, error) {
	s.counts.Add(1)
	return s.Store.CountStalledByQueue(ctx, queues, rule)
}

// uncoveredFixture is a database and a fake asynq that knows queues a to
// d; c has two stalled PROCESSING jobs and d one, a has one and b none.
type uncoveredFixture struct {
	b     *bundle
	store *uncoveredStore
	log   *logBuffer
}

func newUncoveredFixture(t *testing.T) *uncoveredFixture {
	t.Helper()
	b := setup(t)
	for _, q := range []string{"a", "b", "c", "d"} {
		b.lister.queues[q] = asynqstate.ActiveTasks{}
	}
	for i, q := range []string{"a", "c", "c", "d"} {
		b.db.Insert(t, jobstest.Job{ID: fmt.Sprintf("J%d-%s", i, q), Type: "report.export", Generation: 1, Queue: q,
			StartedAgo: jobstest.Ago(31 * time.Minute), IdleAgo: 21 * time.Minute})
	}
	b.db.Insert(t, jobstest.Job{ID: "fresh-b", Type: "report.export", Generation: 1, Queue: "b",
		StartedAgo: jobstest.Ago(time.Minute), IdleAgo: time.Minute})
	return &uncoveredFixture{b: b, store: &uncoveredStore{Store: b.db.Daemon()}, log: &logBuffer{}}
}

// reaper returns a Reaper over the fixture with o's options, logging to
// f.log and counting in f.b.metrics.
func (f *uncoveredFixture) reaper(o reaper.Options) *reaper.Reaper {
	o.Rule, o.Metrics = baselineRule, f.b.metrics
	o.Logger = slog.New(slog.NewTextHandler(f.log, nil))
	return reaper.New(f.store, f.b.lister, f.b.markers, o)
}

// lease takes the leader lease of queues as a new holder, valid for ttl.
func (f *uncoveredFixture) lease(t *testing.T, ttl time.Duration, queues ...string) pgstore.LeaderLeaseHolder {
	t.Helper()
	h := pgstore.NewLeaderLeaseHolder(time.Now())
	st, err := f.b.db.Daemon().AcquireLeaderLease(context.Background(), pgstore.LeaderLeaseParams{Key: pgstore.LeaderLeaseKey(queues), Holder: h, TTL: ttl})
	if err != nil || !st.Held {
		t.Fatalf("taking the leader lease of %v: held %v, %v", queues, st.Held, err)
	}
	return h
}

func (f *uncoveredFixture) gauge(t *testing.T, q string) float64 {
	return metricValue(t, f.b.reg, "jobreaper_uncovered_processing_jobs", map[string]string{"queue": q})
}

func runPass(t *testing.T, r *reaper.Reaper) reaper.Result {
	t.Helper()
	res, err := r.RunOnce(context.Background())
	if err != nil || res.Errors != 0 {
		t.Fatalf("pass: %v, %d errors", err, res.Errors)
	}
	return res
}

func TestUncoveredQueueCheck(t *testing.T) {
	t.Parallel()

	// run --once --queues a, with a live lease of {b} and an expired one
	// of {d}: c and d are uncovered, with their counts; a lease of {c, d}
	// taken since covers them.
	t.Run("RunOnceReportsWhatNeitherTheLeasesNorItsQueuesCover", func(t *testing.T) {
		t.Parallel()
		f := newUncoveredFixture(t)
		f.lease(t, time.Hour, "b")
		f.lease(t, time.Second, "d")
		f.b.db.Exec(t, `UPDATE leader_leases SET expires_at = now() - interval '1 second' WHERE key = $1`, pgstore.LeaderLeaseKey([]string{"d"}))
		r := f.reaper(reaper.Options{Queues: []string{"a"}, Once: true})
		res := runPass(t, r)
		if want := map[string]int{"c": 2, "d": 1}; !maps.Equal(res.UncoveredQueues, want) {
			t.Fatalf("UncoveredQueues = %v, want %v", res.UncoveredQueues, want)
		}
		if f.gauge(t, "c") != 2 || f.gauge(t, "d") != 1 {
			t.Fatalf("gauge c %v, d %v, want 2 and 1", f.gauge(t, "c"), f.gauge(t, "d"))
		}
		if f.store.leaseReads.Load() != 1 || f.store.counts.Load() != 1 {
			t.Fatalf("%d lease reads and %d counts, want one each", f.store.leaseReads.Load(), f.store.counts.Load())
		}
		lines := f.log.take()
		if countLines(lines, "level=WARN", "uncovered queues:", "uncovered.c=2", "uncovered.d=1", "jobs=3") != 1 {
			t.Fatalf("want one warning naming c=2 and d=1:\n%v", lines)
		}

		// The same finding again: no second warning.
		runPass(t, r)
		if lines := f.log.take(); countLines(lines, "uncovered queues:") != 0 {
			t.Fatalf("the same finding was logged again:\n%v", lines)
		}
		// A count changes: warned again.
		f.b.db.Exec(t, `UPDATE jobs SET updated_at = now() WHERE id = 'J3-d'`)
		if res := runPass(t, r); !maps.Equal(res.UncoveredQueues, map[string]int{"c": 2}) {
			t.Fatalf("after d's job moved: %v, want c: 2", res.UncoveredQueues)
		}
		if lines := f.log.take(); countLines(lines, "level=WARN", "uncovered.c=2") != 1 || countLines(lines, "uncovered.d") != 0 {
			t.Fatalf("want one warning naming c only:\n%v", lines)
		}
		if f.gauge(t, "d") != 0 {
			t.Fatalf("gauge d %v after its job moved, want 0", f.gauge(t, "d"))
		}

		f.lease(t, time.Hour, "c", "d")
		counts := f.store.counts.Load()
		if res := runPass(t, r); res.UncoveredQueues == nil || len(res.UncoveredQueues) != 0 {
			t.Fatalf("with c and d covered: %v, want {}", res.UncoveredQueues)
		}
		if f.store.counts.Load() != counts {
			t.Fatal("the stalled jobs were counted although no queue is uncovered")
		}
		if lines := f.log.take(); countLines(lines, "level=INFO", "uncovered queues: none left") != 1 {
			t.Fatalf("want the change logged once:\n%v", lines)
		}
		if f.gauge(t, "c") != 0 || f.gauge(t, "d") != 0 {
			t.Fatalf("gauges c %v, d %v once covered, want 0", f.gauge(t, "c"), f.gauge(t, "d"))
		}
	})

	// A run of every queue covers all: no statement of the check at all.
	t.Run("RunOnceOfEveryQueueCoversAll", func(t *testing.T) {
		t.Parallel()
		f := newUncoveredFixture(t)
		res := runPass(t, f.reaper(reaper.Options{Once: true}))
		if res.UncoveredQueues == nil || len(res.UncoveredQueues) != 0 || f.store.leaseReads.Load() != 0 {
			t.Fatalf("UncoveredQueues %v after %d lease reads, want {} and none", res.UncoveredQueues, f.store.leaseReads.Load())
		}
	})

	// A daemon without a leader lease (--leader-lease=false) makes no
	// check.
	t.Run("ADaemonWithoutALeaderLeaseMakesNoCheck", func(t *testing.T) {
		t.Parallel()
		f := newUncoveredFixture(t)
		res := runPass(t, f.reaper(reaper.Options{Queues: []string{"a"}}))
		if len(res.UncoveredQueues) != 0 || f.store.leaseReads.Load() != 0 {
			t.Fatalf("UncoveredQueues %v after %d lease reads, want none", res.UncoveredQueues, f.store.leaseReads.Load())
		}
	})

	// Two daemons with leader leases of {a} and {b}: the leader of {a},
	// whose key sorts first, reports c and d; the leader of {b} reads the
	// leases only. When a lease of a set sorting before {a} appears, the
	// leader of {a} stops checking and its gauge drops to 0.
	t.Run("OnlyTheLeaderWhoseSetSortsFirstChecks", func(t *testing.T) {
		t.Parallel()
		f := newUncoveredFixture(t)
		ctx := context.Background()
		daemon := func(q string) (*reaper.Reaper, *reaper.LeaderLease) {
			l := reaper.NewLeaderLease(f.b.db.Daemon(), []string{q}, pgstore.NewLeaderLeaseHolder(time.Now()), time.Hour,
				reaper.NewSettings(time.Hour, 5*time.Minute, 15*time.Minute, []string{q}, nil), testLogger(t), nil)
			if !l.Attempt(ctx) {
				t.Fatalf("the daemon of %s does not take its leader lease", q)
			}
			return f.reaper(reaper.Options{Queues: []string{q}, LeaderLease: l}), l
		}
		ra, _ := daemon("a")
		rb, _ := daemon("b")
		if res := runPass(t, rb); len(res.UncoveredQueues) != 0 || f.store.counts.Load() != 0 {
			t.Fatalf("the leader of b reported %v and counted %d times, want nothing", res.UncoveredQueues, f.store.counts.Load())
		}
		if lines := f.log.take(); countLines(lines, "uncovered queues:") != 0 {
			t.Fatalf("the leader of b logged about uncovered queues:\n%v", lines)
		}
		if res := runPass(t, ra); !maps.Equal(res.UncoveredQueues, map[string]int{"c": 2, "d": 1}) {
			t.Fatalf("the leader of a reported %v, want c: 2, d: 1", res.UncoveredQueues)
		}
		if lines := f.log.take(); countLines(lines, "level=WARN", "uncovered.c=2", "uncovered.d=1") != 1 {
			t.Fatalf("want the leader of a's warning:\n%v", lines)
		}
		if f.gauge(t, "c") != 2 {
			t.Fatalf("gauge c %v, want 2", f.gauge(t, "c"))
		}

		f.lease(t, time.Hour, "0") // ["0"] sorts before ["a"]
		if res := runPass(t, ra); len(res.UncoveredQueues) != 0 {
			t.Fatalf("the leader of a reported %v once another set sorts first, want nothing", res.UncoveredQueues)
		}
		if f.gauge(t, "c") != 0 || f.gauge(t, "d") != 0 {
			t.Fatalf("gauges c %v, d %v once another leader checks, want 0", f.gauge(t, "c"), f.gauge(t, "d"))
		}
	})

	// A daemon of every queue covers all: it reads nothing for the check.
	t.Run("ADaemonOfEveryQueueReadsNothing", func(t *testing.T) {
		t.Parallel()
		f := newUncoveredFixture(t)
		l := reaper.NewLeaderLease(f.b.db.Daemon(), nil, pgstore.NewLeaderLeaseHolder(time.Now()), time.Hour,
			reaper.NewSettings(time.Hour, 5*time.Minute, 15*time.Minute, nil, nil), testLogger(t), nil)
		if !l.Attempt(context.Background()) {
			t.Fatal("no leader lease")
		}
		res := runPass(t, f.reaper(reaper.Options{LeaderLease: l}))
		if len(res.UncoveredQueues) != 0 || f.store.leaseReads.Load() != 0 {
			t.Fatalf("UncoveredQueues %v after %d lease reads, want none", res.UncoveredQueues, f.store.leaseReads.Load())
		}
	})
}
