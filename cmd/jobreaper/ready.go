package main

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"runtime/debug"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/jobreaper/jobreaper/reaper"
)

// readyCheckEvery is how often the daemon checks PostgreSQL and Redis for
// /readyz: often enough that a probe (Kubernetes: every 10 s) sees an
// outage within a few seconds, rarely enough to cost nothing (one SELECT 1
// and one PING).
const readyCheckEvery = 2 * time.Second

// readiness holds the outcome of the last PostgreSQL and Redis checks that
// /readyz reports. A follower of the leader lease is ready: readiness
// says whether this replica could run passes, not whether it runs them.
// Once the daemon gives up (fail), /readyz and /healthz answer 503.
type readiness struct {
	pool      *pgxpool.Pool
	rdb       redis.UniversalClient
	opTimeout time.Duration
	log       *slog.Logger
	metrics   *reaper.Metrics

	mu       sync.Mutex
	problems map[string]string // dependency -> why its last check failed
	checked  bool
	// fatal, when set, is why the daemon gave up and is stopping.
	fatal string

	stopped chan struct{}
}

// checkProblem is the problems key of a check that panicked.
const checkProblem = "check"

// startReadiness checks both dependencies once, then every
// readyCheckEvery in the background until ctx is done; wait for it with
// stop. A check that panics is recovered, logged and counted in metrics
// (which may be nil), and reported as a failed check.
func startReadiness(ctx context.Context, pool *pgxpool.Pool, rdb redis.UniversalClient, opTimeout time.Duration, log *slog.Logger,
	metrics *reaper.Metrics) *readiness {
	r := &readiness{pool: pool, rdb: rdb, opTimeout: opTimeout, log: log.With("component", "readyz"), metrics: metrics,
		stopped: make(chan struct{})}
	r.check(ctx)
	go func() {
		defer close(r.stopped)
		t := time.NewTicker(readyCheckEvery)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				r.check(ctx)
			}
		}
	}()
	return r
}

// stop waits for the background checks to end (their ctx must be done).
func (r *readiness) stop() {
	if r != nil {
		<-r.stopped
	}
}

// check runs both checks, each bounded by the op timeout, and records
// their outcomes; a change is logged. A panic in a check is recovered
// here, on the goroutine it happened on: logged at ERROR with its stack,
// counted, and recorded as a failed check until a check succeeds.
func (r *readiness) check(ctx context.Context) {
	defer func() {
		v := recover()
		if v == nil {
			return
		}
		r.log.Error("readiness check panicked; it was recovered and counts as a failed check", "panic", fmt.Sprint(v),
			"stack", string(debug.Stack()))
		r.metrics.CountPanic()
		r.mu.Lock()
		defer r.mu.Unlock()
		r.problems, r.checked = map[string]string{checkProblem: fmt.Sprintf("the readiness check panicked: %v", v)}, true
	}()
	problems := map[string]string{}
	pctx, cancel := context.WithTimeout(ctx, r.opTimeout)
	// A statement, not pgx's Ping: the pool's tracer (pgstore.ConnWatch) sees
	// statements, and a connection this check finds lost counts for the
	// outage grace like one the pass finds.
	if _, err := r.pool.Exec(pctx, "SELECT 1"); err != nil {
		problems["postgresql"] = oneLine(err.Error())
	}
	cancel()
	rctx, cancel := context.WithTimeout(ctx, r.opTimeout)
	if err := r.rdb.Ping(rctx).Err(); err != nil {
		problems["redis"] = oneLine(err.Error())
	}
	cancel()
	if ctx.Err() != nil {
		return // stopping: a cancelled check says nothing of the servers
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for dep, why := range problems {
		if _, was := r.problems[dep]; !was || !r.checked {
			r.log.Warn("not ready: a dependency check failed", "dependency", dep, "err", why)
		}
	}
	for dep := range r.problems {
		if _, still := problems[dep]; !still {
			r.log.Info("ready again: the dependency check succeeded", "dependency", dep)
		}
	}
	r.problems, r.checked = problems, true
}

// fail makes /readyz and /healthz answer 503 with why from now on: the
// daemon gave up and is stopping.
func (r *readiness) fail(why string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.fatal = why
}

// ServeHTTP answers /readyz: 200 "ready" when the last checks of both
// dependencies succeeded, else 503 naming each failing dependency and why;
// 503 with the reason once the daemon gave up.
func (r *readiness) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.fatal != "" {
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = fmt.Fprintf(w, "not ready: %s\n", r.fatal)
		return
	}
	if len(r.problems) == 0 {
		_, _ = w.Write([]byte("ready\n"))
		return
	}
	w.WriteHeader(http.StatusServiceUnavailable)
	var b strings.Builder
	for _, dep := range []string{"postgresql", "redis"} {
		if why, ok := r.problems[dep]; ok {
			fmt.Fprintf(&b, "not ready: %s check failed: %s\n", dep, why)
		}
	}
	if why, ok := r.problems[checkProblem]; ok {
		fmt.Fprintf(&b, "not ready: %s\n", why)
	}
	_, _ = w.Write([]byte(b.String()))
}

// serveHealthz answers /healthz: 200 "ok" while the process runs its
// passes (whether they succeed is for
// jobreaper_last_success_timestamp_seconds and its alert, since a restart
// does not fix an unreachable database), 503 with the reason once the
// daemon gave up (a restart may fix that).
func (r *readiness) serveHealthz(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.fatal != "" {
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = fmt.Fprintf(w, "not healthy: %s\n", r.fatal)
		return
	}
	_, _ = w.Write([]byte("ok\n"))
}
