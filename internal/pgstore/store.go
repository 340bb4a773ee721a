package pgstore

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/jobreaper/jobreaper/internal/pgcore"
)

// Job statuses and the failure reasons the daemon writes, as stored in
// jobs.status and jobs.failure_reason (jobs exports the same values).
const (
	StatusQueued     = pgcore.StatusQueued
	StatusProcessing = pgcore.StatusProcessing
	StatusCompleted  = pgcore.StatusCompleted
	StatusFailed     = pgcore.StatusFailed

	// ReasonStalled: reaped because runtime exceeded the type's max_runtime
	// and the job made no progress for the stall timeout.
	ReasonStalled = "stalled"
	// ReasonLostTask: reaped because asynq will never run the job's task
	// again (archived, completed or gone) while the row said PROCESSING.
	ReasonLostTask = "lost_task"
	// ReasonCancelled: an operator cancelled the job (Cancel).
	ReasonCancelled = "cancelled"
)

// Store runs the daemon's and the operator commands' statements against
// one schema (WithSchema), naming it in every statement as the worker's
// Store does.
type Store struct {
	core *pgcore.Core
	// leader is the leader lease reap transactions check before COMMIT;
	// nil without WithLeaderLease.
	leader *leaderFence
	// leaderTTL is the leader lease's TTL (WithLeaderLeaseTTL), which
	// bounds how long a reap transaction may sit idle; 0 when not given.
	leaderTTL time.Duration
	// beforeReapCommit, set by tests only, runs in each reap transaction
	// after its leader lease check, just before COMMIT.
	beforeReapCommit func()
	// watch is the pool's ConnWatch (WithConnWatch) PassClock records
	// outage ends from; nil without it.
	watch *ConnWatch
	// noTimeline is set once PostgreSQL refused pg_control_checkpoint() to
	// this role: PassClock reads no timeline from then on.
	noTimeline atomic.Bool
}

// options collects what New's options set.
type options struct {
	cfg       pgcore.Config
	leader    *leaderFence
	leaderTTL time.Duration
	watch     *ConnWatch
}

// Option configures a Store.
type Option func(*options)

// WithSchema sets the schema of jobreaper's tables (default
// pgcore.SchemaDefault, "public"); the caller has checked the name
// (idcheck.ValidSchema).
func WithSchema(name string) Option {
	return func(o *options) { o.cfg.Schema = name }
}

// WithOpTimeout sets the timeout of each operation (default
// pgcore.OpTimeoutDefault); d of 0 or less keeps it.
func WithOpTimeout(d time.Duration) Option {
	return func(o *options) {
		if d > 0 {
			o.cfg.OpTimeout = d
		}
	}
}

// WithCascades makes the Store run each job type's on_failed statements in
// the transaction of a reap or a cancel, and its on_requeued statements in
// that of a requeue. Check them at start with PrepareCascades.
func WithCascades(c pgcore.Cascades) Option {
	return func(o *options) { o.cfg.Cascades = c }
}

// New returns a Store over db, configured by opts.
func New(db pgcore.DB, opts ...Option) *Store {
	o := options{cfg: pgcore.Config{Schema: pgcore.SchemaDefault, OpTimeout: pgcore.OpTimeoutDefault}}
	for _, opt := range opts {
		opt(&o)
	}
	return &Store{core: pgcore.New(db, o.cfg), leader: o.leader, leaderTTL: o.leaderTTL, watch: o.watch}
}

// FromCore returns a Store over core, the Core of a worker's Store, with
// neither leader lease nor ConnWatch: tests use it to reap what a worker
// Store claimed, with the same schema and cascades.
func FromCore(core *pgcore.Core) *Store {
	return &Store{core: core}
}

// Schema returns the schema of jobreaper's tables the Store's statements
// name; queue.Enqueue names it in the statement that registers an unknown
// job type.
func (s *Store) Schema() string { return s.core.Schema() }

// Get reads one job row and its type limits, as the worker's Store.Get
// does: an error wrapping pgcore.ErrNotFound when no row has the ID, one
// wrapping idcheck.ErrBadID (nothing sent) for an ID no row can have.
func (s *Store) Get(ctx context.Context, id string) (pgcore.Snapshot, error) {
	return s.core.Get(ctx, id)
}

// PrepareCascades checks the Store's cascades at start, as the worker's
// Store.PrepareCascades does (see pgcore.Core.PrepareCascades): a misspelt
// table, or a statement that would end the reap's transaction, fails here
// naming the type, the hook and the statement, each wrapping
// pgcore.ErrBadCascade.
func (s *Store) PrepareCascades(ctx context.Context) error {
	return s.core.PrepareCascades(ctx)
}

// Now returns the database clock's now(). It returns a wrapped driver
// error or the operation's timeout.
func (s *Store) Now(ctx context.Context) (time.Time, error) {
	ctx, done := s.core.Op(ctx, "Now")
	var now time.Time
	err := s.core.DB().QueryRow(ctx, `SELECT now()`).Scan(&now)
	return now, done(err)
}

// LimitsMicros returns l's limits in whole microseconds as PostgreSQL
// compares them, exact far beyond time.Duration's 292 years for Limits read
// from the database (see pgcore.LimitsMicros); stall and hard are nil when
// NULL. reaper.Decide compares with them, as StallPredicate does in SQL.
func LimitsMicros(l *pgcore.Limits) (maxRuntime int64, stall, hard *int64) {
	return pgcore.LimitsMicros(l)
}

// AddMicros returns a + b, saturated at math.MaxInt64 and math.MinInt64
// instead of wrapping around.
func AddMicros(a, b int64) int64 { return pgcore.AddMicros(a, b) }
