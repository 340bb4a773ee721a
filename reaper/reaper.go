package reaper

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/jobreaper/jobreaper/internal/asynqstate"
	"github.com/jobreaper/jobreaper/internal/failpoint"
	"github.com/jobreaper/jobreaper/internal/idcheck"
	"github.com/jobreaper/jobreaper/internal/pgstore"
	"github.com/jobreaper/jobreaper/jobs"
)

// IntervalDefault is the time between two daemon passes.
const IntervalDefault = time.Minute

// Store is what a pass needs from PostgreSQL; *pgstore.Store satisfies it.
type Store interface {
	PassClock(ctx context.Context, p pgstore.PassClockParams) (pgstore.PassClock, error)
	LoadForTasks(ctx context.Context, ids []string) (map[string]jobs.Snapshot, error)
	ReapBatch(ctx context.Context, p pgstore.ReapBatchParams) (pgstore.ReapBatchResult, error)
	ListLostCandidates(ctx context.Context, p pgstore.LostCandidatesParams) ([]jobs.Snapshot, error)
	ListDeadEarlyCandidates(ctx context.Context, p pgstore.DeadEarlyCandidatesParams) ([]jobs.Snapshot, error)
	MarkMarkersSet(ctx context.Context, refs []pgstore.MarkerRef) error
	MarkMarkersFailed(ctx context.Context, refs []pgstore.MarkerRef) error
	ListMissingMarkers(ctx context.Context, now time.Time, within time.Duration, limit int) ([]pgstore.MissingMarker, error)
	ListReaped(ctx context.Context, p pgstore.ReapedParams) ([]pgstore.Reaped, error)
	CountReaped(ctx context.Context, p pgstore.ReapedParams) (int, error)
	ProcessingQueues(ctx context.Context) ([]string, error)
	StalledWithoutQueue(ctx context.Context, rule pgstore.StallRule, limit int) ([]string, error)
	ListStaleQueued(ctx context.Context, p pgstore.StaleQueuedParams) ([]pgstore.StaleQueued, error)
	UncoveredStore
	OpenHolds(ctx context.Context, queues []string) ([]pgstore.Hold, error)
	StartHold(ctx context.Context, p pgstore.StartHoldParams) (pgstore.Hold, error)
	DrainHolds(ctx context.Context, ids []int64, queues []string, now time.Time) error
}

// Lister lists active tasks and looks single tasks up;
// *asynqstate.InspectorLister satisfies it.
type Lister interface {
	asynqstate.ActiveLister
	asynqstate.TaskLookup
}

// Markers is what a pass needs from the marker store; *asynqstate.MarkerWriter
// satisfies it.
type Markers interface {
	Set(ctx context.Context, jobID string, generation int64, ttl time.Duration) (bool, error)
}

// BatchMarkers is a marker store that also writes many markers in one
// pipeline; *asynqstate.MarkerWriter is one. The pass uses SetMany when the
// store has it, and one Set per marker otherwise.
type BatchMarkers interface {
	Markers
	SetMany(ctx context.Context, writes []asynqstate.MarkerWrite) []asynqstate.MarkerResult
}

// Options configure a Reaper.
type Options struct {
	// Queues to scan; empty means every queue the lister reports, asked
	// again at every pass.
	Queues []string
	// Interval between daemon passes (default IntervalDefault).
	Interval time.Duration
	// Rule is the stall rule's daemon-wide part. Its OutageEnd is not
	// read: each pass sets it from its clock reading (OutageGrace).
	Rule pgstore.StallRule
	// OutageGrace makes idle time never count across a PostgreSQL outage:
	// each pass reads the last outage end (pgstore.Store.PassClock, recording
	// a new one first when this process saw its connections lost, or
	// PostgreSQL restarted or was promoted) and a job idle since before it
	// is held (SkipOutageGrace) until one stall timeout after it. The
	// daemon sets it from the outage_grace setting (default true); false,
	// the zero value, turns it off, for tests that backdate rows on a
	// PostgreSQL that may have started a moment ago.
	OutageGrace bool
	// StartJitter is the upper bound of a random delay before the daemon's
	// first pass, so sidecars started together do not scan together. 0
	// disables it.
	StartJitter time.Duration
	// Logger receives the pass's logs (default slog.Default()).
	Logger *slog.Logger
	// Metrics may be nil.
	Metrics *Metrics
	// Clock drives the daemon loop (default the real clock).
	Clock clockwork.Clock
	// Eviction, when set, is asked for Redis's maxmemory-policy at the
	// first pass and every EvictionCheckInterval after (checkEviction).
	Eviction EvictionChecker
	// PassRecord, when set, records each pass that ran to its end for the
	// status page (reaper_passes); a dry run records nothing.
	PassRecord *PassRecord
	// LeaderLease, when set, makes the daemon loop (Start) run passes only
	// while this replica holds it; the Store's reap transactions must then
	// check it too (pgstore.WithLeaderLease). RunOnce neither takes, waits
	// for, nor checks it; a pass reads its key and holder only to know
	// whether this replica makes the uncovered-queue check (its key sorts
	// first among the live leader leases). Without it, a pass makes that
	// check only with Once (run --once).
	LeaderLease *LeaderLease
	// DryRun makes passes write nothing (no UPDATE, event, marker,
	// cascade or cancel, no marker repair) and record every decision in
	// Result.Decisions, counting the jobs they would reap in Reaped. The
	// decisions come from the same code as a real pass's.
	DryRun bool
	// Canceller, when set, publishes asynq's cancel of the running
	// handler of each reaped job, stalled or lost, after its batch's
	// markers are written (cancel on reap, B30).
	Canceller Canceller
	// RetryCanceller publishes the cancels of retry-reaped stalled jobs'
	// handlers, whatever cancel on reap says (the retry needs the worker
	// slot); default Canceller.
	RetryCanceller Canceller
	// Replacer replaces the archived or completed task of a retry-reaped
	// job (a lost one at its reap, any one a later pass finds stranded).
	// Without it such a job's task is not replaced (an error of the pass).
	Replacer TaskReplacer
	// LoadBatch is how many task IDs one load of rows names (default
	// pgstore.LoadBatchSize); a pass holds one batch of rows at a time, and a
	// batch that fails to load costs only its own tasks.
	LoadBatch int
	// MarkerCheckWindow is the time within which every marker of the last
	// 7 days is re-asserted, a slice per pass (default
	// MarkerCheckWindowDefault).
	MarkerCheckWindow time.Duration
	// Asynq reads task states and live servers for the lost-task search
	// and the stale QUEUED report (default: the lister, when it can).
	Asynq AsynqState
	// MaxLostPerPass is the most jobs one cycle over the lost-task
	// candidates may reap as lost_task; a cycle that would reap more reaps
	// none of them. 0: no limit.
	MaxLostPerPass int
	// MaxStalledPerPass is the most jobs one pass may reap as stalled in
	// the queues no stall-storm hold covers; a pass that would reap more
	// reaps none of them and records a hold on their queues
	// (reaper_holds). 0: no limit. A hold already recorded is honoured
	// whatever the limits.
	MaxStalledPerPass int
	// MaxStalledFraction is the largest share of the active tasks a pass
	// judged in those queues that it may reap as stalled, once they are
	// StormMinStalled or more; a pass that would reap more holds them
	// likewise. 0: no limit; at most 1.
	MaxStalledFraction float64
	// StallStormHold is how long a hold the pass records lasts; 0: the
	// longest stall timeout among the held jobs' types.
	StallStormHold time.Duration
	// StaleQueuedAfter is how long a job must have been QUEUED before it
	// is reported as stale when asynq will never run its task (default
	// StaleQueuedAfterDefault).
	StaleQueuedAfter time.Duration
	// StaleQueuedLookups bounds the old QUEUED rows one daemon pass looks
	// up (default StaleQueuedLookupsDefault).
	StaleQueuedLookups int
	// Once makes every pass do all of its paced work at once: re-assert
	// every marker, visit every lost-task candidate and every stale QUEUED
	// row (run --once).
	Once bool
	// RedisName names the Redis the pass reads, as host:port/db and never
	// with a password, in the warning of a pass whose marker writes were
	// held (default "the Redis this daemon reads").
	RedisName string
	// Suggest, when set, returns the name among known nearest to name
	// when it is close enough to be a typo, else "": the did-you-mean of a
	// queue asynq does not know (Result.QueueSuggestions).
	Suggest func(name string, known []string) string
}

// Reaper runs passes, once (RunOnce) or in a loop (Start, Stop).
type Reaper struct {
	store   Store
	lister  Lister
	markers Markers
	opts    Options
	log     *slog.Logger
	// recorder names this process in the outage row it records.
	recorder string

	eviction evictionState
	reassert reassertState
	lost     lostState
	// deadEarly is the dead-early search's cursor.
	deadEarly deadEarlyState
	stale     staleState
	retry     retryState
	badNames  badQueueNames

	// uncovered is what the last uncovered-queue check reported.
	uncovered uncoveredState

	mu      sync.Mutex
	cancel  context.CancelFunc
	stopped chan struct{}
	// passCancel stops the running daemon pass when the leader lease is
	// lost; nil between passes.
	passCancel context.CancelFunc
	// fatal carries the loop's ErrPassesPanicked to Fatal (capacity 1).
	fatal chan error
}

// New returns a Reaper. It does not contact anything until RunOnce or Start.
func New(store Store, lister Lister, markers Markers, opts Options) *Reaper {
	opts.Interval = cmp.Or(opts.Interval, IntervalDefault)
	opts.LoadBatch = cmp.Or(opts.LoadBatch, pgstore.LoadBatchSize)
	opts.MarkerCheckWindow = cmp.Or(opts.MarkerCheckWindow, MarkerCheckWindowDefault)
	opts.StaleQueuedAfter = cmp.Or(opts.StaleQueuedAfter, StaleQueuedAfterDefault)
	opts.StaleQueuedLookups = cmp.Or(opts.StaleQueuedLookups, StaleQueuedLookupsDefault)
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Clock == nil {
		opts.Clock = clockwork.NewRealClock()
	}
	return &Reaper{
		store: store, lister: lister, markers: markers, opts: opts,
		log:   opts.Logger.With("component", "reaper"),
		fatal: make(chan error, 1), recorder: recorder(),
	}
}

// ErrPassFailed wraps the cause when a pass could not run at all: the
// database clock could not be read or the queue list could not be
// discovered. Nothing was written.
var ErrPassFailed = errors.New("reaper pass could not run")

// RunOnce runs one pass: one database clock reading, the active tasks of
// every queue (their IDs are the one list a pass holds in full) and, batch
// by batch as they are listed, their rows and limits and a decision per
// job; once every task is judged, the stall-storm holds of its queues and
// check (reapStalled), one set-based reap per batch of stalled jobs and
// their markers in one pipeline; then the lost-task search, and the
// summary. It
// returns the pass's Result, and an error wrapping ErrPassFailed only when
// the pass could not run at all; failures inside the pass (a queue that
// fails to list, a reap or marker write that fails) are counted in
// Result.Errors and logged, and the pass goes on with what it can do safely.
func (r *Reaper) RunOnce(ctx context.Context) (Result, error) {
	start := time.Now()
	var (
		res Result
		err error
	)
	// A panic anywhere in the pass, also on its listing goroutine (which
	// carries it here), ends the pass, never the process.
	p := contain(func() { res, err = r.pass(ctx) })
	if p != nil {
		res, err = newResult(), fmt.Errorf("%w: %v", ErrPassPanicked, p)
		res.Panicked = true
	}
	end := time.Now()
	outcome := passOutcome(ctx, res, err)
	res.Interrupted = outcome == outcomeCancelled
	r.opts.Metrics.pass(res, end.Sub(start).Seconds(), outcome, float64(end.Unix()))
	if r.opts.PassRecord != nil && !r.opts.DryRun && err == nil && outcome != outcomeCancelled && outcome != outcomePanicked {
		r.recordPass(ctx, res)
	}
	attrs := []any{"scanned", res.Scanned, "reaped", res.Reaped, "skipped", res.Skipped, "scanned_by", res.ScannedBy,
		"errors", res.Errors, "duration_ms", end.Sub(start).Milliseconds()}
	if outcome != outcomeCancelled && err == nil {
		if e := res.CheckScanned(); e != nil {
			r.log.Error(ScannedMismatchLog, "err", e)
		}
	}
	switch {
	case outcome == outcomePanicked:
		logPanic(r.log, "pass panicked; it was recovered and ended there (a bug, or a value jobreaper does not expect: "+
			"report the panic and its stack)", p, "duration_ms", end.Sub(start).Milliseconds())
	case outcome == outcomeCancelled:
		r.log.Info("pass stopped before its end (shutdown); not counted as a clean pass", attrs...)
	case err != nil:
		r.log.Error("pass could not run", append(attrs, "err", err)...)
	case res.Errors > 0:
		r.log.Warn("pass finished with errors", attrs...)
	case r.opts.DryRun:
		r.log.Info("dry run finished; nothing was written (reaped counts what a real pass would try to reap)", attrs...)
	case res.StallStormHeld > 0:
		r.log.Info("pass held stalled jobs under a stall-storm hold", append(attrs, "stall_storm_held", res.StallStormHeld)...)
	case res.Reaped > 0:
		r.log.Info("pass reaped jobs", attrs...)
	default:
		r.log.Debug("pass finished", attrs...)
	}
	return res, err
}

// passOutcome labels a finished pass. A pass whose ctx was cancelled
// (SIGTERM, Stop) skipped the rest of its work, and the errors it met
// meanwhile were not counted, so it is never ok. A pass that panicked is
// panicked, whatever else happened.
func passOutcome(ctx context.Context, res Result, err error) string {
	switch {
	case res.Panicked:
		return outcomePanicked
	case err != nil && ctx.Err() == nil:
		return outcomeFailed
	case ctx.Err() != nil:
		return outcomeCancelled
	case res.Errors > 0:
		return outcomeErrors
	}
	return outcomeOK
}

func (r *Reaper) pass(ctx context.Context) (Result, error) {
	failpoint.Inject("pass") // test builds only
	res := newResult()
	// Redis's eviction policy, at the first pass and hourly; never an
	// error of the pass.
	r.checkEviction(ctx)
	// Step 1: one clock reading, from the database that wrote the
	// timestamps, with the last outage end (outage.go).
	now, err := r.readClock(ctx, &res)
	if err != nil {
		r.opts.Metrics.errorAt(stageClock)
		return res, fmt.Errorf("%w: reading the database clock: %w", ErrPassFailed, err)
	}
	queues := r.opts.Queues
	// asynq's queue list when the pass read it, for the uncovered-queue
	// check.
	var known []string
	if len(queues) == 0 {
		if queues, err = r.lister.Queues(ctx); err != nil {
			r.opts.Metrics.errorAt(stageQueues)
			return res, fmt.Errorf("%w: listing asynq queues: %w", ErrPassFailed, err)
		}
		known = queues
		// And the queues PROCESSING rows name, which asynq may have
		// forgotten (its data lost): their jobs must not stay PROCESSING
		// unseen.
		named, err := r.store.ProcessingQueues(ctx)
		if err != nil {
			r.failed(ctx, &res, stageLoad, "reading the queues of PROCESSING rows failed; only the queues asynq lists are scanned this pass", "err", err)
		}
		queues = union(queues, named)
	}
	// A name no PostgreSQL text or metric label can hold is skipped.
	queues = r.checkQueues(queues, &res)
	// The queues live asynq servers serve, read once, on first need, by
	// the marker hold and the lost-task search.
	live := &liveServers{state: r.asynqState()}
	// Markers whose write failed in an earlier pass (first, so that a
	// write failing in this pass is not retried at once), then every
	// marker of the last 7 days, a slice per pass, so that one lost to a
	// failover or an eviction comes back within MarkerCheckWindow; both
	// held while no live server serves a queue of the pass. A dry run
	// writes none.
	if !r.opts.DryRun {
		hold := &markerHold{queues: queues, live: live}
		tried := r.repairMarkers(ctx, now, hold, &res)
		r.reassertMarkers(ctx, now, tried, hold, &res)
		r.warnMarkersHeld(hold, &res)
	}
	// Active tasks of every queue, judged; a queue that fails is an error
	// of this pass and none of its tasks or rows is touched.
	judged := newJudgement()
	ids, listed, noLease := r.scanActive(ctx, queues, now, &res, judged)
	// Their stalled jobs, reaped once all are judged: held while a
	// stall-storm hold holds their queues, or when they are too many at
	// once.
	r.reapStalled(ctx, judged, queues, listed, now, &res)
	// Stalled rows of the listed queues whose task is not active; a batch
	// that failed to load above does not stop it.
	r.reapLost(ctx, listed, ids, noLease, live, now, &res)
	// Dead attempts of types that opted into reap_dead_early, before
	// their max_runtime.
	r.reapDeadEarly(ctx, listed, ids, noLease, live, now, &res)
	// What retry reaps started and asynq stranded: replaced, cancelled
	// again, or failed.
	r.finishRetries(ctx, listed, live, &res)
	// QUEUED jobs asynq will never run: reported, never changed.
	r.reportStaleQueued(ctx, &res)
	// Queues asynq knows that no live leader lease's queue set covers,
	// with stalled jobs: reported by one leader (and run --once).
	r.checkUncovered(ctx, known, &res)
	r.logHeld(&res)
	return res, nil
}

// logSkip warns about the skips an operator must act on (a job type's
// limits or a row the pass cannot judge) and notes the others at debug
// level when debug is on (debug: the pass checked it once; building the
// attributes of 100,000 disabled lines costs more than the decisions).
func (r *Reaper) logSkip(id string, snap *jobs.Snapshot, v Verdict, debug bool) {
	switch v.Skip {
	case SkipBadLimits:
		r.log.Warn("job skipped: its type's limits are unsafe; fix the job_types row", "job_id", id, "type", snap.Type,
			"reason", v.Skip, "rule", v.Why, "max_runtime", v.MaxRuntime, "stall_timeout", v.StallTimeout)
	case SkipUnknownType:
		r.log.Warn("job skipped: no job_types row for its type; insert one", "job_id", id, "type", snap.Type, "reason", v.Skip)
	case SkipBadRow:
		r.log.Warn("job skipped: its row holds a value the stall rule cannot be applied to; fix the row", "job_id", idcheck.QuoteID(id),
			"type", snap.Type, "reason", v.Skip, "value", v.Why)
	case SkipNoStartTime:
		r.log.Warn("job skipped: PROCESSING without started_at (not claimed through the start guard)", "job_id", id,
			"type", snap.Type, "reason", v.Skip)
	case SkipNoRow:
		if !debug {
			return
		}
		r.log.Debug("task skipped: no job row with its ID", "job_id", id, "reason", v.Skip)
	default:
		if !debug {
			return
		}
		r.log.Debug("job skipped", "job_id", id, "reason", v.Skip, "runtime", v.Runtime, "idle", v.Idle)
	}
}

// union returns the sorted union of a and b, each name once.
func union(a, b []string) []string {
	out := append(slices.Clone(a), b...)
	slices.Sort(out)
	return slices.Compact(out)
}

// errNoAsynqState: the Reaper was built without a way to read asynq's
// task states and live servers.
var errNoAsynqState = errors.New("no asynq state reader configured (Options.Asynq)")

// brokenSampleMax bounds how many IDs of broken active entries one warning
// names, so that a queue whose hashes were all lost logs one short line.
const brokenSampleMax = 20

// brokenSample returns the IDs of broken entries for a log line: at most
// brokenSampleMax of them, each quoted with Go escapes (an ID may hold any
// byte), separated by spaces, with "..." when there are more.
func brokenSample(ids []string) string {
	quoted := make([]string, 0, min(len(ids), brokenSampleMax)+1)
	for i, id := range ids {
		if i == brokenSampleMax {
			quoted = append(quoted, "...")
			break
		}
		quoted = append(quoted, strconv.QuoteToASCII(id))
	}
	return strings.Join(quoted, " ")
}

// failed counts and logs an error of the pass at stage. An error caused by
// the pass being stopped (ctx done) is not an error of the pass: it is
// noted at debug level and not counted.
func (r *Reaper) failed(ctx context.Context, res *Result, stage, msg string, args ...any) {
	if ctx.Err() != nil {
		r.log.Debug(msg+" (pass stopped)", args...)
		return
	}
	r.opts.Metrics.errorAt(stage)
	r.log.Error(msg, args...)
	res.Errors++
}

// failedN counts n errors of the pass at stage with one log line (n
// markers of one batch whose writes failed together).
func (r *Reaper) failedN(ctx context.Context, res *Result, stage string, n int, msg string, args ...any) {
	if n <= 0 {
		return
	}
	r.failed(ctx, res, stage, msg, args...)
	if ctx.Err() != nil {
		return
	}
	for range n - 1 {
		r.opts.Metrics.errorAt(stage)
	}
	res.Errors += n - 1
}
