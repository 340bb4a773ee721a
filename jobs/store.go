package jobs

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// OpTimeoutDefault bounds every single statement or transaction this package
// runs, so that a hung PostgreSQL turns into an error the caller can retry
// next cycle instead of a stuck pass.
const OpTimeoutDefault = 10 * time.Second

// DB is what Store needs from PostgreSQL: *pgxpool.Pool satisfies it, and so
// does pgx.Tx (Begin opens a savepoint), which lets tests run a whole
// scenario inside one transaction whose now() does not move.
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Begin(ctx context.Context) (pgx.Tx, error)
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// Store runs jobreaper's statements against one schema, set by WithSchema.
// Every statement names that schema itself ("schema".jobs), so the Store
// works the same on a direct connection and behind a transaction-mode
// pooler such as PgBouncer, where a search_path set by the client does not
// survive (see Connect).
type Store struct {
	db DB
	// schema is the schema of jobreaper's tables, as given; ident is its
	// quoted identifier that q writes for {schema}.
	schema, ident string
	// rendered caches q's output per statement text: copy on write, so
	// the hot path reads it without a lock or an allocation.
	rendered   atomic.Pointer[map[string]string]
	renderedMu sync.Mutex
	// events receives late_result_rejected events, outside the caller's
	// transaction that a refused write leaves to be rolled back.
	events    DB
	opTimeout time.Duration
	cascades  Cascades
	// metrics are the worker library's series; nil without WithRegisterer.
	metrics *workerMetrics
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

// schemaPlaceholder is what statements of this package write where the
// Store's schema goes: {schema}.jobs, {schema}.job_types, ...
const schemaPlaceholder = "{schema}"

// StoreOption configures a Store.
type StoreOption func(*Store)

// WithOpTimeout sets the timeout of each operation (default OpTimeoutDefault).
func WithOpTimeout(d time.Duration) StoreOption {
	return func(s *Store) {
		if d > 0 {
			s.opTimeout = d
		}
	}
}

// WithSchema sets the schema of jobreaper's tables (default SchemaDefault,
// "public"). Every statement of the Store names it, quoted, so a name is
// never read as SQL; a name that breaks ValidSchema (Connect's and the
// config's rule) is reported by Store.CheckSchema as ErrBadSchema, and the
// daemon and the worker wiring call that check at start.
func WithSchema(name string) StoreOption {
	return func(s *Store) { s.schema = name }
}

// WithCascades makes the Store run each job type's on_failed and
// on_completed statements inside the transaction that changes a job of that
// type. Check them at start with Store.PrepareCascades (which runs
// Cascades.Validate first), so that a typo fails there, naming the type and
// the statement, instead of failing the first reap or completion.
func WithCascades(c Cascades) StoreOption {
	return func(s *Store) { s.cascades = c }
}

// WithEventsDB makes the Store write late_result_rejected events through
// events instead of the Store's own handle. Such an event is written while
// the caller still holds the transaction it is about to roll back (a refused
// Complete or Advance), so it needs a connection of its own: give a small
// separate pool when the main pool can be exhausted by callers that each hold
// a transaction. Without this option the events go through the handle passed
// to NewStore; when that handle is itself a pgx.Tx (a test running a whole
// scenario in one transaction) the events share its fate.
func WithEventsDB(events DB) StoreOption {
	return func(s *Store) { s.events = events }
}

// NewStore returns a Store over db.
func NewStore(db DB, opts ...StoreOption) *Store {
	s := &Store{db: db, opTimeout: OpTimeoutDefault, schema: SchemaDefault}
	for _, o := range opts {
		o(s)
	}
	s.ident = pgx.Identifier{s.schema}.Sanitize()
	s.rendered.Store(&map[string]string{})
	if s.events == nil {
		s.events = s.db
	}
	return s
}

// DB returns the database handle the Store runs on.
func (s *Store) DB() DB { return s.db }

// Schema returns the schema of jobreaper's tables the Store's statements
// name (WithSchema; SchemaDefault when not set).
func (s *Store) Schema() string { return s.schema }

// q returns sql with every {schema} replaced by the Store's quoted schema
// identifier. Every statement of this package about jobreaper's own tables
// goes through it before it is sent; operator cascades do not (their
// unqualified names are the product's, resolved by the connection's
// search_path). The rendered text is cached per statement, so a call
// after the first neither locks nor allocates; the cache keeps every
// distinct text, so sql must be one of the package's fixed statements,
// never text built per call.
func (s *Store) q(sql string) string {
	if out, ok := (*s.rendered.Load())[sql]; ok {
		return out
	}
	out := strings.ReplaceAll(sql, schemaPlaceholder, s.ident)
	s.renderedMu.Lock()
	defer s.renderedMu.Unlock()
	old := *s.rendered.Load()
	next := make(map[string]string, len(old)+1)
	for k, v := range old {
		next[k] = v
	}
	next[sql] = out
	s.rendered.Store(&next)
	return out
}

// op gives one operation its own timeout. Its done func maps the error: it
// names the operation, says when the operation's own timeout fired (still
// wrapping context.DeadlineExceeded), and turns pgx.ErrNoRows into
// ErrNotFound.
func (s *Store) op(ctx context.Context, name string) (context.Context, func(error) error) {
	ctx, cancel := context.WithTimeout(ctx, s.opTimeout)
	return ctx, func(err error) error {
		defer cancel()
		if err == nil {
			return nil
		}
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("jobs.%s: %w", name, ErrNotFound)
		}
		if errors.Is(err, context.DeadlineExceeded) && ctx.Err() != nil {
			return fmt.Errorf("jobs.%s timed out after %s: %w", name, s.opTimeout, err)
		}
		return fmt.Errorf("jobs.%s: %w", name, err)
	}
}

// inTx runs fn in a transaction on s.db and commits it when fn returns nil.
// Before COMMIT it checks once that the transaction is still open
// (checkTxOpen, no round trip): a cascade statement that ended it makes the
// operation fail with ErrTxEnded instead of reporting a write that did not
// commit with the rest. fn holds jobreaper's statements and the operator's
// cascades only, all bounded by ctx (the operation's timeout); a failed
// COMMIT is worded by what became of the transaction (commitOutcome).
func (s *Store) inTx(ctx context.Context, fn func(pgx.Tx) error) error {
	tx, err := s.db.Begin(ctx)
	if err != nil {
		return err
	}
	defer s.rollback(ctx, tx)
	if err := fn(tx); err != nil {
		return err
	}
	if err := checkTxOpen(tx, ""); err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return commitOutcome(err, "")
	}
	return nil
}
