package reaper_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jobreaper/jobreaper/internal/pgstore"
	"github.com/jobreaper/jobreaper/reaper"
)

// failingLeaseStore answers every leader lease attempt with err.
type failingLeaseStore struct{ err error }

func (s failingLeaseStore) AcquireLeaderLease(context.Context, pgstore.LeaderLeaseParams) (pgstore.LeaderLeaseState, error) {
	return pgstore.LeaderLeaseState{}, s.err
}
func (failingLeaseStore) ReleaseLeaderLease(context.Context, string, string) error { return nil }

// lockedBuilder is a strings.Builder safe for a logger's writes.
type lockedBuilder struct {
	mu sync.Mutex
	b  strings.Builder
}

func (w *lockedBuilder) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

func (w *lockedBuilder) count(s string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return strings.Count(w.b.String(), s)
}

// A leader lease that keeps failing with the same error (PostgreSQL down)
// is logged at WARN once a minute, not at every attempt (three a
// interval); a new error is logged at once.
func TestFailedLeaderLeaseAttemptsWarnOnceAMinute(t *testing.T) {
	t.Parallel()
	logs := &lockedBuilder{}
	log := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
	store := &failingLeaseStore{err: errors.New("dial tcp 127.0.0.1:5432: connect: connection refused")}
	l := reaper.NewLeaderLease(store, nil, pgstore.NewLeaderLeaseHolder(time.Now()), time.Second, reaper.Settings{}, log, nil)
	now := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	reaper.SetLeaderLeaseClock(l, func() time.Time { return now })
	const msg = "leader lease attempt failed"
	for i := 0; i < 20; i++ { // 20 attempts, 2 s apart: 40 s
		if l.Attempt(t.Context()) {
			t.Fatal("a failed attempt holds the leader lease")
		}
		now = now.Add(2 * time.Second)
	}
	if n := logs.count(msg); n != 1 {
		t.Fatalf("%d WARN lines over 40 s of failures, want 1:\n%s", n, logs.b.String())
	}
	now = now.Add(time.Minute)
	l.Attempt(t.Context())
	if n := logs.count(msg); n != 2 {
		t.Fatalf("%d WARN lines a minute later, want 2", n)
	}
	store.err = errors.New("password authentication failed")
	l.Attempt(t.Context())
	if n := logs.count(msg); n != 3 {
		t.Fatalf("%d WARN lines after a new error, want 3", n)
	}
}
