package queue

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/hibiken/asynq"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"

	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
)

// guardBundle is one guard test's fixtures: its own PostgreSQL schema and
// its own miniredis.
type guardBundle struct {
	db      *jobstest.DB
	store   *jobs.Store
	mr      *miniredis.Miniredis
	rc      *redis.Client
	markers *MarkerStore
	reg     *prometheus.Registry
}

func setupGuard(t testing.TB) *guardBundle {
	t.Helper()
	db := jobstest.New(t)
	db.JobType(t, "report.export", "30 minutes", "", "")
	// The recorder handler returns nil without calling jobs.Complete; an
	// auto_complete type lets such an attempt settle as COMPLETED (the
	// outcome mapping's own tests cover the other types).
	db.Exec(t, `UPDATE job_types SET auto_complete = true WHERE name = 'report.export'`)
	mr, c := miniRedis(t)
	markers, err := NewMarkerStore(c)
	if err != nil {
		t.Fatal(err)
	}
	return &guardBundle{db: db, store: db.Store(), mr: mr, rc: c, markers: markers, reg: prometheus.NewRegistry()}
}

// guard returns a Guard named worker over the bundle's store and markers
// (store and markers may be replaced by passing non-nil ones).
func (b *guardBundle) guard(t *testing.T, worker string, store GuardStore, markers MarkerReader) *Guard {
	t.Helper()
	if store == nil {
		store = b.store
	}
	if markers == nil {
		markers = b.markers
	}
	g := NewGuard(store, markers, WithWorker(worker), WithLogger(testLogger(t)), WithRegisterer(b.reg))
	g.taskID = testTaskID
	return g
}

func (b *guardBundle) decisions(decision string) float64 {
	return testutil.ToFloat64(newGuardMetrics(b.reg).decisions.WithLabelValues(decision))
}

// asynq offers no public way to build a handler context carrying a task
// ID, so guard tests that do not run a real asynq.Server put it here.
type testTaskIDKey struct{}

func testTaskID(ctx context.Context) (string, bool) {
	id, ok := ctx.Value(testTaskIDKey{}).(string)
	return id, ok
}

// recorder is a handler that counts its runs and keeps the lease it saw.
type recorder struct {
	mu     sync.Mutex
	calls  int
	lease  jobs.Lease
	leaseE error
	result error
}

func (r *recorder) ProcessTask(ctx context.Context, _ *asynq.Task) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls++
	r.lease, r.leaseE = jobs.LeaseFromContext(ctx)
	return r.result
}

func (r *recorder) runs() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.calls
}

// deliver runs the task of jobID through g's middleware into h, as a
// worker's asynq.Server would.
func deliver(ctx context.Context, g *Guard, jobID string, h asynq.Handler) error {
	ctx = context.WithValue(ctx, testTaskIDKey{}, jobID)
	return g.Middleware()(h).ProcessTask(ctx, asynq.NewTask("report.export", nil))
}

// requireRefused asserts err wraps asynq.SkipRetry and want, and that the
// handler did not run.
func requireRefused(t *testing.T, err error, want error, h *recorder) {
	t.Helper()
	if !errors.Is(err, asynq.SkipRetry) || !errors.Is(err, want) {
		t.Fatalf("guard returned %v, want an error wrapping asynq.SkipRetry and %v", err, want)
	}
	if n := h.runs(); n != 0 {
		t.Fatalf("handler ran %d times, want 0", n)
	}
}

// requireUnavailable asserts the guard failed closed: the handler did not
// run and asynq will retry (no SkipRetry) without counting a failure.
func requireUnavailable(t *testing.T, err error, h *recorder) {
	t.Helper()
	if err == nil || errors.Is(err, asynq.SkipRetry) || !errors.Is(err, ErrGuardUnavailable) || IsFailure(err) {
		t.Fatalf("guard returned %v, want a retryable error wrapping ErrGuardUnavailable that IsFailure reports false", err)
	}
	if n := h.runs(); n != 0 {
		t.Fatalf("handler ran %d times, want 0", n)
	}
}

func requireRow(t *testing.T, db *jobstest.DB, id, status string, generation int64) jobstest.Row {
	t.Helper()
	r := db.Read(t, id)
	if r.Status != status || r.Generation != generation {
		t.Fatalf("job %s is %s generation %d, want %s generation %d", id, r.Status, r.Generation, status, generation)
	}
	return r
}

func failRow(t *testing.T, db *jobstest.DB, id, reason string) {
	t.Helper()
	db.Exec(t, `UPDATE jobs SET status = 'FAILED', failure_reason = $2, finished_at = now() WHERE id = $1`, id, reason)
}

// failingClaim reads rows from the real store and fails every claim with
// err, like a connection lost between the read and the claim.
type failingClaim struct {
	*jobs.Store
	err error
}

func (f *failingClaim) Claim(context.Context, string, int64, string) (jobs.Lease, error) {
	return jobs.Lease{}, f.err
}

// readBarrier holds each Get until wg's count of readers have read, so
// that racing guards both read before either claims.
type readBarrier struct {
	*jobs.Store
	wg sync.WaitGroup
	// readers is how many Gets the barrier holds (the guards' admission
	// reads); later Gets (the outcome mapping's) pass straight through.
	readers atomic.Int32
}

func (r *readBarrier) Get(ctx context.Context, id string) (jobs.Snapshot, error) {
	sn, err := r.Store.Get(ctx, id)
	if r.readers.Add(1) <= 2 {
		r.wg.Done()
		r.wg.Wait()
	}
	return sn, err
}

// writeMarker writes jobID's marker for generation with ttl, as the
// reaper's first write of a marker does (SET with its expiry, when the key
// is absent), for the guard's tests; the reaper's compare-and-set is
// internal/asynqstate's MarkerWriter. set is false when a marker was there.
func writeMarker(ctx context.Context, s *MarkerStore, jobID string, generation int64, ttl time.Duration) (set bool, err error) {
	return s.client.SetNX(ctx, MarkerKey(jobID), strconv.FormatInt(generation, 10), ttl).Result()
}
