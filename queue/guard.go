package queue

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/hibiken/asynq"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/jobreaper/jobreaper/internal/idcheck"
	"github.com/jobreaper/jobreaper/jobs"
)

// Sentinel errors of the start guard. The guard's errors wrap one of them
// (test with errors.Is); refusals also wrap asynq.SkipRetry so that asynq
// archives the task instead of retrying it.
var (
	// ErrJobReaped: the job was reaped. Either a marker records the row's
	// current generation (or a newer one), or the row is FAILED with
	// failure_reason stalled or lost_task. Wrapped with asynq.SkipRetry.
	ErrJobReaped = errors.New("job was reaped")

	// ErrJobFailed: the row is FAILED for another reason (a worker's Fail,
	// a cancel). Wrapped with asynq.SkipRetry.
	ErrJobFailed = errors.New("job has failed")

	// ErrGuardUnavailable: the guard could not read the job row or the
	// marker, or the claim failed for a reason other than losing it, so it
	// could not tell whether the task may run. The handler did not run and
	// asynq retries the task; IsFailure reports false for it.
	ErrGuardUnavailable = errors.New("start guard unavailable: cannot read the job row or marker, or claim the job")

	// ErrNoTaskID: the context carries no asynq task ID, so there is no job
	// to look up (the handler is not running under an asynq.Server).
	// Wrapped with asynq.SkipRetry.
	ErrNoTaskID = errors.New("no asynq task ID in context")
)

// A task whose ID cannot be a job ID (jobs.CheckID: a NUL byte, invalid
// UTF-8, longer than jobs.MaxIDLength) is refused with an error wrapping
// jobs.ErrBadID and asynq.SkipRetry: no retry could ever find its row.

// GuardStore is what the start guard needs from PostgreSQL; *jobs.Store
// satisfies it.
type GuardStore interface {
	// Get reads the job row; an error wrapping jobs.ErrNotFound when none.
	Get(ctx context.Context, id string) (jobs.Snapshot, error)
	// Claim starts an attempt if the row is still at expectedGeneration;
	// an error wrapping jobs.ErrClaimLost when another claim won.
	Claim(ctx context.Context, id string, expectedGeneration int64, worker string) (jobs.Lease, error)
	// Release, Fail and AutoComplete settle an attempt after its handler
	// returned; each is fenced by the lease (see outcome.go). The guard
	// calls them once with a context detached from the handler's and
	// expects them to retry a transient failure themselves, as
	// *jobs.Store's do; an error they return is final for the guard.
	Release(ctx context.Context, lease jobs.Lease) error
	Fail(ctx context.Context, lease jobs.Lease, code string) error
	AutoComplete(ctx context.Context, lease jobs.Lease) (jobs.CompleteResult, error)
}

// MarkerReader reads markers; *MarkerStore satisfies it.
type MarkerReader interface {
	// Get returns the generation jobID's marker records, or found=false.
	Get(ctx context.Context, jobID string) (generation int64, found bool, err error)
}

// Guard is the start guard: asynq middleware that, before each task's
// handler runs, refuses the task when its job was reaped or is terminal
// and otherwise claims the job and hands the handler the lease.
type Guard struct {
	store GuardStore
	// admitter is store's one-statement admission (admitterOf), or nil.
	admitter admitter
	markers  MarkerReader
	worker   string
	logger   *slog.Logger
	metrics  *guardMetrics
	// taskID reads the task ID from the handler's context; tests replace
	// it, since asynq offers no public way to build such a context.
	taskID func(context.Context) (string, bool)
	// retries reads the attempt's retry count and maximum from the
	// handler's context (asynq.GetRetryCount, asynq.GetMaxRetry); tests
	// replace it like taskID.
	retries func(context.Context) (retried, maxRetry int, ok bool)
	// stallTimeout is the daemon's stall timeout for types without their
	// own (WithStallTimeout), for the short-deadline check.
	stallTimeout time.Duration
	// now reads this host's clock, the clock asynq's deadlines are on.
	now func() time.Time
	// warnedTypes holds the job types whose short deadline was logged.
	warnedTypes sync.Map
}

// GuardOption configures a Guard.
type GuardOption func(*Guard)

// WithWorker sets the worker name the guard's claims record (default
// "<hostname>:<pid>"). An empty name keeps the default.
func WithWorker(name string) GuardOption {
	return func(g *Guard) {
		if name != "" {
			g.worker = name
		}
	}
}

// WithLogger sets the guard's logger (default slog.Default()). A nil logger
// keeps the default.
func WithLogger(l *slog.Logger) GuardOption {
	return func(g *Guard) {
		if l != nil {
			g.logger = l
		}
	}
}

// WithRegisterer registers the guard's metrics with r (default: no
// metrics): jobreaper_guard_decisions_total{decision}, where decision is
// one of the start decisions claimed, refused_reaped, refused_failed,
// acked_completed, claim_lost, no_row, unavailable, no_task_id, bad_job_id
// and bad_marker, or of the settlements of attempts completed,
// auto_completed, no_completion, released, failed, abandoned, lost_job and
// settle_failed; every value exists at 0 from the start. And jobreaper_guard_short_deadline_total{type}:
// claims whose task's deadline ends before started_at + max_runtime +
// stall timeout (see Middleware); a type's series appears at its first
// such claim, and a type name that is not a valid label value (empty,
// invalid UTF-8, a NUL byte, longer than jobs.MaxIDLength bytes: the rule
// of jobs.CheckID) counts under type="". Counters already registered by
// another Guard on r are shared. NewGuard panics, like
// prometheus.MustRegister, when r refuses a counter for another reason.
func WithRegisterer(r prometheus.Registerer) GuardOption {
	return func(g *Guard) {
		if r != nil {
			g.metrics = newGuardMetrics(r)
		}
	}
}

// NewGuard returns a start guard that reads job rows and claims jobs
// through store and reads markers through markers.
func NewGuard(store GuardStore, markers MarkerReader, opts ...GuardOption) *Guard {
	g := &Guard{
		store:        store,
		markers:      markers,
		worker:       defaultWorker(),
		logger:       slog.Default(),
		taskID:       asynq.GetTaskID,
		retries:      asynqRetries,
		stallTimeout: guardStallTimeoutDefault,
		now:          time.Now,
	}
	for _, o := range opts {
		o(g)
	}
	g.logger = g.logger.With("component", "guard")
	g.admitter = admitterOf(store)
	return g
}

func defaultWorker() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown"
	}
	return host + ":" + strconv.Itoa(os.Getpid())
}

// Middleware returns the guard as asynq middleware. Per task, in order:
//
//  1. The task ID (asynq.GetTaskID) is the job ID; none: ErrNoTaskID with
//     asynq.SkipRetry. An ID PostgreSQL cannot store (jobs.CheckID): an
//     error wrapping jobs.ErrBadID and asynq.SkipRetry, a permanent
//     failure, with nothing read or written.
//  2. Read the job row. Missing (jobs.ErrNotFound): a retryable error
//     wrapping jobs.ErrNotFound, since the enqueuer commits the row before
//     it enqueues and the row may simply not be visible yet; it counts as a
//     failure, so a task that never gets a row is archived after its
//     retries. FAILED: ErrJobReaped (reason stalled or lost_task) or
//     ErrJobFailed, with asynq.SkipRetry. COMPLETED: nil, so asynq
//     acknowledges the task without running it.
//  3. Read the marker. A marker whose generation is >= the row's:
//     ErrJobReaped with asynq.SkipRetry. A marker key holding something
//     jobreaper never writes: an error wrapping ErrBadMarker that counts as
//     a failure (asynq retries it with backoff, then archives it; the
//     handler does not run), since no retry can read such a key.
//  4. Claim with the generation read. Lost (jobs.ErrClaimLost: another
//     delivery claimed it first, or the job became terminal): an error
//     wrapping jobs.ErrClaimLost and asynq.SkipRetry.
//  5. At the claim, when the handler context's deadline (asynq's: the
//     earlier of the task's Timeout and Deadline) ends before started_at +
//     max_runtime + stall timeout (the type's own, else WithStallTimeout's),
//     asynq will cut the attempt before the reaper could judge it: the
//     guard counts it in jobreaper_guard_short_deadline_total{type} and
//     logs one WARN per type naming the type, the deadline, max_runtime and
//     the stall timeout. The task runs as before.
//  6. Run the handler with the lease in its context (jobs.WithLease), then
//     map its result through the outcome mapping, whose writes are retried
//     through a blip of a few seconds; one that still fails is counted as
//     settle_failed and logged, and asynq's decision is kept (see
//     docs/worker.md, "What a handler's result does").
//
// Over a *jobs.Store steps 2 to 4 take one Redis and one
// PostgreSQL round trip: the marker is read first, then jobs.Store.Admit
// reads the row, applies the rules of steps 2 and 3 to the row as it
// stands after any lock wait, and claims, all in one statement. The
// answers are the same, in the same order (a missing, COMPLETED or FAILED
// row is answered from the row even when the marker could not be read).
// Another GuardStore is used through Get and Claim as listed.
//
// Fail closed: when the row or the marker cannot be read, or the claim
// fails for another reason, the handler does not run and the error wraps
// ErrGuardUnavailable and is retryable (no asynq.SkipRetry): an outage
// delays a task, it never starts a reaped one.
func (g *Guard) Middleware() asynq.MiddlewareFunc {
	return func(next asynq.Handler) asynq.Handler {
		return asynq.HandlerFunc(func(ctx context.Context, task *asynq.Task) error {
			lease, run, err := g.admit(ctx)
			if !run {
				return err
			}
			ctx = jobs.WithLease(ctx, lease)
			return g.run(ctx, lease, next, task)
		})
	}
}

// run calls the handler and settles its result. A handler that panics is
// settled as a failure with CodePanic (released while retries remain,
// failed on the last attempt), and the panic goes on to asynq, which
// recovers it as the task's error.
func (g *Guard) run(ctx context.Context, lease jobs.Lease, next asynq.Handler, task *asynq.Task) error {
	defer func() {
		if p := recover(); p != nil {
			_ = g.settle(ctx, lease, Failure(CodePanic, fmt.Errorf("handler panic: %v", p)))
			panic(p)
		}
	}()
	return g.settle(ctx, lease, next.ProcessTask(ctx, task))
}

// admit runs steps 1-4 of Middleware. run is true only with a fresh lease.
func (g *Guard) admit(ctx context.Context) (lease jobs.Lease, run bool, err error) {
	id, ok := g.taskID(ctx)
	if !ok || id == "" {
		g.count(decisionNoTaskID)
		g.logger.ErrorContext(ctx, "task refused: no task ID in context", "reason", "no_task_id")
		return jobs.Lease{}, false, fmt.Errorf("queue.Guard: %w: %w", ErrNoTaskID, asynq.SkipRetry)
	}
	if err := jobs.CheckID(id); err != nil {
		// Another producer sharing the Redis enqueued it: no row can have
		// this ID, and sending it would fail the read, then every retry.
		g.count(decisionBadJobID)
		g.logger.ErrorContext(ctx, "task refused for good: its ID cannot be a job ID",
			"reason", "bad_job_id", "job_id", idcheck.QuoteID(id), "err", err)
		return jobs.Lease{}, false, fmt.Errorf("queue.Guard: %w: %w", err, asynq.SkipRetry)
	}
	log := g.logger.With("job_id", id)
	if g.admitter != nil {
		return g.admitOneTrip(ctx, log, id)
	}

	row, err := g.store.Get(ctx, id)
	if errors.Is(err, jobs.ErrNotFound) {
		return g.noRow(ctx, log, id, err)
	}
	if err != nil {
		return g.unavailable(ctx, log, id, "reading the job row", err)
	}
	log = log.With("generation", row.Generation)
	switch row.Status {
	case jobs.StatusCompleted:
		return g.ackCompleted(ctx, log)
	case jobs.StatusFailed:
		return g.refuseFailed(ctx, log, id, row.Generation, row.FailureReason)
	}

	marked, found, err := g.markers.Get(ctx, id)
	if errors.Is(err, ErrBadMarker) {
		return g.badMarker(ctx, log, id, err)
	}
	if err != nil {
		return g.unavailable(ctx, log, id, "reading the marker", err)
	}
	if found && marked >= row.Generation {
		return g.refuseMarked(ctx, log, id, row.Generation, marked)
	}

	lease, err = g.store.Claim(ctx, id, row.Generation, g.worker)
	if errors.Is(err, jobs.ErrClaimLost) {
		return g.claimLost(ctx, log, err)
	}
	if err != nil {
		return g.unavailable(ctx, log, id, "claiming the job", err)
	}
	return g.claimed(ctx, log, lease)
}

func (g *Guard) unavailable(ctx context.Context, log *slog.Logger, id, step string, err error) (jobs.Lease, bool, error) {
	g.count(decisionUnavailable)
	log.WarnContext(ctx, "task not started: guard cannot decide, asynq will retry",
		"reason", "unavailable", "step", step, "error", err.Error())
	return jobs.Lease{}, false, fmt.Errorf("queue.Guard: job %s: %s: %w: %w", id, step, ErrGuardUnavailable, err)
}

// IsFailure is meant for asynq.Config.IsFailure. It returns false for nil
// and for errors wrapping ErrGuardUnavailable, true for every other error.
//
// What asynq v0.26.0 does with a non-failure error (processor.go
// handleFailedMessage, rdb.Retry): if the task is not yet out of retries
// and the error does not wrap asynq.SkipRetry, the task still goes to the
// retry set, delayed by RetryDelayFunc(retried, ...); but its Retried
// count is not incremented, so an outage neither uses up the task's
// retries nor grows its backoff, and the queue's processed and failed
// counters are not incremented. The error text is still recorded as the
// task's last error, and Config.ErrorHandler is still called. Caveat: asynq checks Retried >= MaxRetry before it
// asks IsFailure, so a delivery that already is the task's last (a task
// with MaxRetry(0), or one whose earlier failures used up its retries) is
// archived even on a non-failure error.
func IsFailure(err error) bool {
	return err != nil && !errors.Is(err, ErrGuardUnavailable)
}
