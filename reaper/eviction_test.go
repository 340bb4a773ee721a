package reaper_test

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/jobreaper/jobreaper/internal/asynqstate"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
	"github.com/jobreaper/jobreaper/queue/redistest"
	"github.com/jobreaper/jobreaper/reaper"
)

// evictionLogs collects log lines of concurrent writers.
type evictionLogs struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *evictionLogs) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *evictionLogs) count(substr string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Count(l.buf.String(), substr)
}

// evictionReaper runs passes over no queue against a Redis of the test's
// own, so that only the eviction check has anything to do.
func evictionReaper(t *testing.T, srv *redistest.Server) (*reaper.Reaper, *prometheus.Registry, *evictionLogs, *clockwork.FakeClock) {
	t.Helper()
	db := jobstest.New(t)
	client := srv.Client(t)
	markers := newMarkers(t, client)
	reg := prometheus.NewRegistry()
	logs := &evictionLogs{}
	clock := clockwork.NewFakeClock()
	r := reaper.New(db.Daemon(), &fakeLister{queues: map[string]asynqstate.ActiveTasks{"none": {}}}, markers, reaper.Options{
		Queues: []string{"none"}, Rule: baselineRule, Metrics: reaper.NewMetrics(reg), Clock: clock, Eviction: asynqstate.NewPolicyReader(client, 0),
		Logger: slog.New(slog.NewTextHandler(io.MultiWriter(logs, scanGuard{t}), &slog.HandlerOptions{Level: slog.LevelInfo})),
	})
	return r, reg, logs, clock
}

func cleanPass(t *testing.T, r *reaper.Reaper) {
	t.Helper()
	res, err := runOnce(t, context.Background(), r)
	if err != nil || res.Errors != 0 {
		t.Fatalf("pass = %+v, %v; the eviction check must never make a pass fail", res, err)
	}
}

const unsafeGauge = "jobreaper_redis_eviction_policy_unsafe"

func TestEvictionPolicyCheck(t *testing.T) {
	t.Parallel()

	t.Run("UnsafePolicyWarnsAtStartAndHourlyUntilFixed", func(t *testing.T) {
		t.Parallel()
		srv := redistest.Start(t, "--maxmemory-policy", "volatile-lru")
		r, reg, logs, clock := evictionReaper(t, srv)
		cleanPass(t, r)
		if got := metricValue(t, reg, unsafeGauge, nil); got != 1 {
			t.Fatalf("%s = %v after the first pass under volatile-lru, want 1", unsafeGauge, got)
		}
		if n := logs.count("maxmemory-policy is not noeviction"); n != 1 {
			t.Fatalf("%d warnings after the first pass, want 1:\n%s", n, logs.buf.String())
		}
		if n := logs.count("maxmemory_policy=volatile-lru"); n != 1 {
			t.Fatalf("the warning does not name the policy:\n%s", logs.buf.String())
		}
		// Fixed by the operator: the next pass within the hour does not ask
		// again, the pass after an hour does.
		if err := srv.Client(t).ConfigSet(context.Background(), "maxmemory-policy", "noeviction").Err(); err != nil {
			t.Fatal(err)
		}
		clock.Advance(reaper.EvictionCheckInterval - time.Minute)
		cleanPass(t, r)
		if got := metricValue(t, reg, unsafeGauge, nil); got != 1 {
			t.Fatalf("%s = %v within the hour, want still 1 (not asked again)", unsafeGauge, got)
		}
		clock.Advance(time.Minute)
		cleanPass(t, r)
		if got := metricValue(t, reg, unsafeGauge, nil); got != 0 {
			t.Fatalf("%s = %v an hour later under noeviction, want 0", unsafeGauge, got)
		}
		if n := logs.count("maxmemory-policy is not noeviction"); n != 1 {
			t.Fatalf("%d warnings, want 1", n)
		}
	})

	t.Run("RefusedConfigGetIsSaidOnceAtInfo", func(t *testing.T) {
		t.Parallel()
		srv := redistest.Start(t, "--rename-command", "CONFIG", "")
		r, reg, logs, clock := evictionReaper(t, srv)
		for range 3 {
			cleanPass(t, r)
			clock.Advance(reaper.EvictionCheckInterval)
		}
		if n := logs.count("level=INFO msg=\"could not check Redis's eviction policy"); n != 1 {
			t.Fatalf("refusal said %d times at info over 3 hourly checks, want once:\n%s", n, logs.buf.String())
		}
		if n := logs.count("level=WARN") + logs.count("level=ERROR"); n != 0 {
			t.Fatalf("a refused CONFIG GET logged %d warnings or errors, want none:\n%s", n, logs.buf.String())
		}
		if got := metricValue(t, reg, unsafeGauge, nil); got != 0 {
			t.Fatalf("%s = %v, want 0 when the policy cannot be read", unsafeGauge, got)
		}
	})

	t.Run("NoevictionIsQuiet", func(t *testing.T) {
		t.Parallel()
		srv := redistest.Start(t, "--maxmemory-policy", asynqstate.EvictionPolicySafe)
		r, reg, logs, _ := evictionReaper(t, srv)
		cleanPass(t, r)
		if got := metricValue(t, reg, unsafeGauge, nil); got != 0 || logs.count("level=WARN") != 0 {
			t.Fatalf("%s = %v, logs:\n%s", unsafeGauge, got, logs.buf.String())
		}
	})
}
