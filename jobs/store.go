package jobs

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/jobreaper/jobreaper/internal/pgcore"
)

// OpTimeoutDefault bounds every single statement or transaction a Store
// runs, so that a hung PostgreSQL turns into an error the caller can retry
// instead of a stuck handler.
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

// Store runs the worker's statements against one schema, set by
// WithSchema. Every statement names that schema itself ("schema".jobs), so
// the Store works the same on a direct connection and behind a
// transaction-mode pooler such as PgBouncer, where a search_path set by the
// client does not survive (see Connect).
type Store struct {
	core *pgcore.Core
	// cfg collects the options; NewStore builds core from it.
	cfg pgcore.Config
	// events receives late_result_rejected events, outside the caller's
	// transaction that a refused write leaves to be rolled back.
	events DB
	// metrics are the worker library's series; nil without WithRegisterer.
	metrics *workerMetrics
}

// StoreOption configures a Store.
type StoreOption func(*Store)

// WithOpTimeout sets the timeout of each operation (default
// OpTimeoutDefault): each statement of the worker's calls, and each of
// jobreaper's own statements (BEGIN, the fenced UPDATE, COMMIT) around the
// function given to CompleteWith or AfterCompleted, never that function.
// d of 0 or less keeps the default.
func WithOpTimeout(d time.Duration) StoreOption {
	return func(s *Store) {
		if d > 0 {
			s.cfg.OpTimeout = d
		}
	}
}

// WithSchema sets the schema of jobreaper's tables (default SchemaDefault,
// "public"). Every statement of the Store names it, quoted, so a name is
// never read as SQL; a name that is not a plain identifier (letters,
// digits, underscore, at most 63 bytes: Connect's and the config's rule)
// is reported by Store.CheckSchema as ErrBadSchema, and the daemon and the
// worker wiring call that check at start.
func WithSchema(name string) StoreOption {
	return func(s *Store) { s.cfg.Schema = name }
}

// WithCascades makes the Store run each job type's on_failed and
// on_completed statements inside the transaction that changes a job of that
// type (Fail, Complete, CompleteWith, AutoComplete). Check them at start
// with Store.PrepareCascades (which runs Cascades.Validate first), so that
// a typo fails there, naming the type and the statement, instead of
// failing the first completion. Give the workers the daemon's cascades
// (the config file's): a reap runs the same on_failed statements.
func WithCascades(c Cascades) StoreOption {
	return func(s *Store) { s.cfg.Cascades = c }
}

// WithEventsDB makes the Store write late_result_rejected events through
// events instead of the Store's own handle. Such an event is written while
// the caller still holds the transaction it is about to roll back (a refused
// Complete, Advance or CheckCompleted in the caller's transaction), so it
// needs a connection of its own: give a small separate pool when the main
// pool can be exhausted by callers that each hold a transaction.
// CompleteWith and AfterCompleted own their transaction and roll it back
// before they record the event, so they need no second connection. Without this option the events go through the handle passed
// to NewStore; when that handle is itself a pgx.Tx (a test running a whole
// scenario in one transaction) the events share its fate.
func WithEventsDB(events DB) StoreOption {
	return func(s *Store) { s.events = events }
}

// NewStore returns a Store over db, configured by opts.
func NewStore(db DB, opts ...StoreOption) *Store {
	s := &Store{cfg: pgcore.Config{Schema: SchemaDefault, OpTimeout: OpTimeoutDefault}}
	for _, o := range opts {
		o(s)
	}
	s.core = pgcore.New(db, s.cfg)
	if s.events == nil {
		s.events = db
	}
	return s
}

// Schema returns the schema of jobreaper's tables the Store's statements
// name (WithSchema; SchemaDefault when not set). queue.Enqueue names it in
// the statement that registers an unknown job type.
func (s *Store) Schema() string { return s.core.Schema() }

// PrepareCascades checks the Store's cascades (WithCascades) at start:
// Cascades.Validate, then each statement is parsed and planned by
// PostgreSQL (Parse and Describe, the named arguments rewritten to $n as at
// run time) inside a transaction that is rolled back, so a misspelt table
// or column fails here, naming the type, the hook and the statement, rather
// than at the first completion or failure. With no cascades it sends
// nothing.
//
// Each statement must also be one that PostgreSQL's own PREPARE accepts: a
// SELECT, INSERT, UPDATE, DELETE, MERGE or VALUES statement. PREPARE refuses
// transaction control (COMMIT, ROLLBACK, SAVEPOINT, ...), CALL and DO, which
// could end or escape the transaction that changes the job, so that a
// completion would look committed while its UPDATE was rolled back. Nothing
// is executed.
//
// Errors: the joined problems, each wrapping ErrBadCascade and naming the
// type, the hook, the statement (number and text) and the rule; or a
// wrapped driver error (timeout: the operation's) when PostgreSQL cannot
// be reached.
func (s *Store) PrepareCascades(ctx context.Context) error {
	return s.core.PrepareCascades(ctx)
}
