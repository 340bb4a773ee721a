package reaper_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/jobreaper/jobreaper/internal/asynqstate"
	"github.com/jobreaper/jobreaper/internal/pgstore"
	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
	"github.com/jobreaper/jobreaper/reaper"
)

// panicDeadline bounds the waits of the panic tests: passes run every
// 100 to 200 ms, so a second is plenty; ten times that for a slow machine.
const panicDeadline = 10 * time.Second

// panickyLister panics in ListActive, which the pass calls on its listing
// goroutine, while panics is above 0 (counting down), or always when it is
// below 0.
type panickyLister struct {
	*fakeLister
	mu     sync.Mutex
	panics int
}

func (p *panickyLister) ListActive(ctx context.Context, q string) (asynqstate.ActiveTasks, error) {
	p.mu.Lock()
	n := p.panics
	if n > 0 {
		p.panics--
	}
	p.mu.Unlock()
	if n != 0 {
		panic("an active list entry no lister expects")
	}
	return p.fakeLister.ListActive(ctx, q)
}

// panickyStore panics in PassClock (the pass's clock reading), on the
// pass's own goroutine, at the calls whose number (from 1) panicAt names.
type panickyStore struct {
	*pgstore.Store
	calls   atomic.Int32
	panicAt map[int32]bool
}

func (s *panickyStore) PassClock(ctx context.Context, p pgstore.PassClockParams) (pgstore.PassClock, error) {
	if s.panicAt[s.calls.Add(1)] {
		panic("a clock reading no store expects")
	}
	return s.Store.PassClock(ctx, p)
}

// passesBy returns jobreaper_passes_total{outcome}.
func passesBy(t *testing.T, reg *prometheus.Registry, outcome string) float64 {
	return metricValue(t, reg, "jobreaper_passes_total", map[string]string{"outcome": outcome})
}

// The daemon loop recovers a panic in a pass, whether it happens on the
// pass's own goroutine (the store) or on its listing goroutine (the
// lister), logs it once at ERROR with the stack of the goroutine where it
// happened, counts it as a panicked pass, and goes on: the next clean pass
// reaps the stalled job. Two panics in a row are not three: the daemon
// keeps running.
func TestLoopRecoversAPanicAndGoesOn(t *testing.T) {
	t.Parallel()
	db := jobstest.New(t)
	db.JobType(t, "report.export", "30 minutes", "", "")
	db.Insert(t, jobstest.Job{ID: "J1", Type: "report.export", Generation: 1, Queue: "default",
		StartedAgo: jobstest.Ago(31 * time.Minute), IdleAgo: 21 * time.Minute})
	// Pass 1: the listing panics; pass 2: the clock reading panics.
	lister := &panickyLister{fakeLister: &fakeLister{queues: map[string]asynqstate.ActiveTasks{"default": {IDs: []string{"J1"}}},
		failed: map[string]error{}}, panics: 1}
	store := &panickyStore{Store: db.Daemon(), panicAt: map[int32]bool{2: true}}
	reg := prometheus.NewRegistry()
	log := &logBuffer{}
	r := reaper.New(store, lister, newMarkers(t, miniRedisClient(t)), reaper.Options{Queues: []string{"default"},
		Interval: 100 * time.Millisecond, Rule: baselineRule, Metrics: reaper.NewMetrics(reg),
		Logger: slog.New(slog.NewTextHandler(log, nil))})
	if err := r.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	defer r.Stop()
	deadline := time.Now().Add(panicDeadline)
	for passesBy(t, reg, "ok") < 1 {
		if time.Now().After(deadline) {
			t.Fatalf("no clean pass within %s; panicked %v; log:\n%s", panicDeadline, passesBy(t, reg, "panicked"),
				strings.Join(log.take(), "\n"))
		}
		time.Sleep(20 * time.Millisecond) // polling
	}
	r.Stop()
	if got := db.Read(t, "J1"); got.Status != jobs.StatusFailed {
		t.Fatalf("J1 = %s, want FAILED by the clean pass after the panics", got.Status)
	}
	if got := passesBy(t, reg, "panicked"); got != 2 {
		t.Fatalf("passes_total{outcome=panicked} = %v, want 2", got)
	}
	select {
	case err := <-r.Fatal():
		t.Fatalf("two panics in a row stopped the daemon: %v", err)
	default:
	}
	lines := log.take()
	panics := countLines(lines, "level=ERROR", "panicked")
	if panics != 2 {
		t.Fatalf("%d ERROR lines about a panic, want one per panicked pass (2):\n%s", panics, strings.Join(lines, "\n"))
	}
	// Each with the stack of the goroutine the panic happened on.
	if countLines(lines, "level=ERROR", "an active list entry no lister expects", "goroutine ", "panickyLister") != 1 ||
		countLines(lines, "level=ERROR", "a clock reading no store expects", "goroutine ", "panickyStore") != 1 {
		t.Fatalf("the panics are not logged with their value and the stack where they happened:\n%s", strings.Join(lines, "\n"))
	}
}

// Three passes in a row that panic stop the daemon loop: it gives its
// leader lease up (the row is deleted, jobreaper_leader is 0), stops
// attempting it, and says so on Fatal, which cmd waits on to exit.
func TestLoopGivesUpAfterThreeConsecutivePanickedPasses(t *testing.T) {
	t.Parallel()
	db := jobstest.New(t)
	queues := []string{"default"}
	holder := pgstore.NewLeaderLeaseHolder(time.Now())
	store := db.Daemon(pgstore.WithLeaderLease(pgstore.LeaderLeaseKey(queues), holder.ID))
	reg := prometheus.NewRegistry()
	metrics := reaper.NewMetrics(reg)
	log := &logBuffer{}
	logger := slog.New(slog.NewTextHandler(log, nil))
	const interval = 200 * time.Millisecond
	lease := reaper.NewLeaderLease(store, queues, holder, interval,
		reaper.NewSettings(interval, time.Minute, 15*time.Minute, queues, nil), logger, metrics)
	lister := &panickyLister{fakeLister: &fakeLister{queues: map[string]asynqstate.ActiveTasks{"default": {}}, failed: map[string]error{}}, panics: -1}
	r := reaper.New(store, lister, newMarkers(t, miniRedisClient(t)), reaper.Options{Queues: queues, Interval: interval,
		Rule: baselineRule, Metrics: metrics, Logger: logger, LeaderLease: lease})
	if err := r.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	defer r.Stop()
	select {
	case err := <-r.Fatal():
		if !errors.Is(err, reaper.ErrPassesPanicked) {
			t.Fatalf("Fatal gave %v, want ErrPassesPanicked", err)
		}
	case <-time.After(panicDeadline):
		t.Fatalf("no fatal condition within %s; passes panicked %v", panicDeadline, passesBy(t, reg, "panicked"))
	}
	// By the time Fatal says so, the leader lease is released.
	if n := db.Count(t, `SELECT count(*) FROM `+db.Table("leader_leases")); n != 0 {
		t.Fatalf("%d leader lease rows after the daemon gave up, want 0", n)
	}
	if got := metricValue(t, reg, "jobreaper_leader", map[string]string{}); got != 0 {
		t.Fatalf("jobreaper_leader = %v after the daemon gave up, want 0", got)
	}
	if got := passesBy(t, reg, "panicked"); got != reaper.PanickedPassesMax {
		t.Fatalf("passes_total{outcome=panicked} = %v, want %d", got, reaper.PanickedPassesMax)
	}
	// No further attempt or pass: five renewal periods later, nothing
	// changed (an absence can only be shown by waiting).
	time.Sleep(5 * interval / 3)
	if n := db.Count(t, `SELECT count(*) FROM `+db.Table("leader_leases")); n != 0 {
		t.Fatal("the daemon took its leader lease again after it gave up")
	}
	if got := passesBy(t, reg, "panicked"); got != reaper.PanickedPassesMax {
		t.Fatalf("passes_total{outcome=panicked} = %v after the daemon gave up, want it to stay %d", got, reaper.PanickedPassesMax)
	}
	r.Stop()
	lines := log.take()
	if n := countLines(lines, "level=ERROR", "in a row"); n != 1 {
		t.Fatalf("%d ERROR lines saying the daemon gives up, want 1:\n%s", n, strings.Join(lines, "\n"))
	}
}

// panickyLeaseStore answers the first leader lease attempt and panics at
// every later one; it records the release.
type panickyLeaseStore struct {
	reaper.LeaderLeaseStore
	calls    atomic.Int32
	released atomic.Bool
}

func (s *panickyLeaseStore) AcquireLeaderLease(ctx context.Context, p pgstore.LeaderLeaseParams) (pgstore.LeaderLeaseState, error) {
	if s.calls.Add(1) > 1 {
		panic("a leader lease row no attempt expects")
	}
	return s.LeaderLeaseStore.AcquireLeaderLease(ctx, p)
}

func (s *panickyLeaseStore) ReleaseLeaderLease(ctx context.Context, key, holderID string) error {
	s.released.Store(true)
	return s.LeaderLeaseStore.ReleaseLeaderLease(ctx, key, holderID)
}

// A leader lease attempt that panics, on the renewal goroutine or before
// a pass, is recovered and logged with its stack; the process does not
// die. Attempts before passes that panic three times in a row stop the
// loop like panicked passes, and the leader lease is released.
func TestLeaderLeaseAttemptPanicsAreContained(t *testing.T) {
	t.Parallel()
	db := jobstest.New(t)
	queues := []string{"default"}
	holder := pgstore.NewLeaderLeaseHolder(time.Now())
	store := db.Daemon(pgstore.WithLeaderLease(pgstore.LeaderLeaseKey(queues), holder.ID))
	leaseStore := &panickyLeaseStore{LeaderLeaseStore: store}
	reg := prometheus.NewRegistry()
	metrics := reaper.NewMetrics(reg)
	log := &logBuffer{}
	logger := slog.New(slog.NewTextHandler(log, nil))
	const interval = 300 * time.Millisecond
	lease := reaper.NewLeaderLease(leaseStore, queues, holder, interval,
		reaper.NewSettings(interval, time.Minute, 15*time.Minute, queues, nil), logger, metrics)
	r := reaper.New(store, &fakeLister{queues: map[string]asynqstate.ActiveTasks{"default": {}}, failed: map[string]error{}},
		newMarkers(t, miniRedisClient(t)), reaper.Options{Queues: queues, Interval: interval, Rule: baselineRule,
			Metrics: metrics, Logger: logger, LeaderLease: lease})
	if err := r.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	defer r.Stop()
	select {
	case err := <-r.Fatal():
		if !errors.Is(err, reaper.ErrPassesPanicked) {
			t.Fatalf("Fatal gave %v, want ErrPassesPanicked", err)
		}
	case <-time.After(panicDeadline):
		t.Fatalf("no fatal condition within %s", panicDeadline)
	}
	r.Stop()
	if !leaseStore.released.Load() {
		t.Fatal("the leader lease was not released")
	}
	if n := db.Count(t, `SELECT count(*) FROM `+db.Table("leader_leases")); n != 0 {
		t.Fatalf("%d leader lease rows after the daemon gave up, want 0", n)
	}
	// At most the one pass after the first attempt (a renewal may come
	// first on a slow machine, and then every pass's attempt panics).
	if got := passesBy(t, reg, "ok"); got > 1 {
		t.Fatalf("passes_total{outcome=ok} = %v, want at most the one pass before the attempts began to panic", got)
	}
	lines := log.take()
	if n := countLines(lines, "level=ERROR", "a leader lease row no attempt expects", "goroutine ", "panickyLeaseStore"); n < reaper.PanickedPassesMax {
		t.Fatalf("%d ERROR lines with the attempt's panic and stack, want at least %d:\n%s", n, reaper.PanickedPassesMax, strings.Join(lines, "\n"))
	}
}

// loadPanicStore panics in LoadForTasks, which the pass calls on its own
// goroutine while its listing goroutine still sends chunks.
type loadPanicStore struct{ *pgstore.Store }

func (loadPanicStore) LoadForTasks(context.Context, []string) (map[string]jobs.Snapshot, error) {
	panic("a row no load expects")
}

// A pass that panics while its listing goroutine still has chunks to send
// (more queues than the chunks buffered) stops the listing and takes what
// it sends: RunOnce returns a panicked Result, and no goroutine is left
// blocked on a send (TestMain's goleak check fails the package otherwise).
func TestPassPanicStopsItsListing(t *testing.T) {
	t.Parallel()
	db := jobstest.New(t)
	lister := &fakeLister{queues: map[string]asynqstate.ActiveTasks{}, failed: map[string]error{}}
	var queues []string
	for i := range 64 {
		q := fmt.Sprintf("q%02d", i)
		queues = append(queues, q)
		lister.queues[q] = asynqstate.ActiveTasks{IDs: []string{"J-" + q}}
	}
	r := reaper.New(loadPanicStore{db.Daemon()}, lister, newMarkers(t, miniRedisClient(t)), reaper.Options{Queues: queues,
		LoadBatch: 1, Rule: baselineRule, Logger: testLogger(t)})
	res, err := r.RunOnce(t.Context())
	if !res.Panicked || !errors.Is(err, reaper.ErrPassPanicked) {
		t.Fatalf("RunOnce = %+v, %v; want a panicked pass and ErrPassPanicked", res, err)
	}
}
