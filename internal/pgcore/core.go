package pgcore

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

// OpTimeoutDefault bounds every single statement or transaction a Core
// runs, so that a hung PostgreSQL turns into an error the caller can retry
// next cycle instead of a stuck pass.
const OpTimeoutDefault = 10 * time.Second

// SchemaDefault is the PostgreSQL schema jobreaper's tables live in unless
// configured otherwise.
const SchemaDefault = "public"

// DB is what a Core needs from PostgreSQL: *pgxpool.Pool satisfies it, and
// so does pgx.Tx (Begin opens a savepoint), which lets tests run a whole
// scenario inside one transaction whose now() does not move.
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Begin(ctx context.Context) (pgx.Tx, error)
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// TxBeginner starts transactions: *pgxpool.Pool, *pgx.Conn and pgx.Tx (a
// savepoint) satisfy it.
type TxBeginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// RowQuerier is what reading one row needs: DB and pgx.Tx both have it.
type RowQuerier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Config configures a Core.
type Config struct {
	// Schema is the schema of jobreaper's tables, used as given (a name
	// that breaks ValidSchema is the caller's to refuse).
	Schema string
	// OpTimeout bounds each operation; OpTimeoutDefault when not positive.
	OpTimeout time.Duration
	// Cascades are run inside the transactions that change a job.
	Cascades Cascades
}

// Core runs jobreaper's statements against one schema. Every statement
// names that schema itself ("schema".jobs), so a Core works the same on a
// direct connection and behind a transaction-mode pooler such as
// PgBouncer, where a search_path set by the client does not survive.
type Core struct {
	db DB
	// schema is the schema of jobreaper's tables, as given; ident is its
	// quoted identifier that Q writes for {schema}.
	schema, ident string
	// rendered caches Q's output per statement text: copy on write, so
	// the hot path reads it without a lock or an allocation.
	rendered   atomic.Pointer[map[string]string]
	renderedMu sync.Mutex
	opTimeout  time.Duration
	cascades   Cascades
}

// schemaPlaceholder is what statements write where the Core's schema goes:
// {schema}.jobs, {schema}.job_types, ...
const schemaPlaceholder = "{schema}"

// New returns a Core over db configured by cfg.
func New(db DB, cfg Config) *Core {
	c := &Core{db: db, schema: cfg.Schema, opTimeout: cfg.OpTimeout, cascades: cfg.Cascades}
	if c.opTimeout <= 0 {
		c.opTimeout = OpTimeoutDefault
	}
	c.ident = pgx.Identifier{c.schema}.Sanitize()
	c.rendered.Store(&map[string]string{})
	return c
}

// DB returns the database handle the Core runs on.
func (c *Core) DB() DB { return c.db }

// Schema returns the schema of jobreaper's tables the Core's statements
// name.
func (c *Core) Schema() string { return c.schema }

// OpTimeout returns the timeout of each operation.
func (c *Core) OpTimeout() time.Duration { return c.opTimeout }

// Cascades returns the cascades the Core runs.
func (c *Core) Cascades() Cascades { return c.cascades }

// Q returns sql with every {schema} replaced by the Core's quoted schema
// identifier. Every statement about jobreaper's own tables goes through it
// before it is sent; operator cascades do not (their unqualified names are
// the product's, resolved by the connection's search_path). The rendered
// text is cached per statement, so a call after the first neither locks
// nor allocates; the cache keeps every distinct text, so sql must be one
// of the fixed statements of jobreaper's packages, never text built per
// call.
func (c *Core) Q(sql string) string {
	if out, ok := (*c.rendered.Load())[sql]; ok {
		return out
	}
	out := strings.ReplaceAll(sql, schemaPlaceholder, c.ident)
	c.renderedMu.Lock()
	defer c.renderedMu.Unlock()
	old := *c.rendered.Load()
	next := make(map[string]string, len(old)+1)
	for k, v := range old {
		next[k] = v
	}
	next[sql] = out
	c.rendered.Store(&next)
	return out
}

// Op gives one operation its own timeout. Its done func maps the error: it
// names the operation ("jobs.<name>", for the worker's operations and the
// daemon's alike: they all run on jobreaper's jobs tables), says when the
// operation's own timeout fired (still wrapping context.DeadlineExceeded),
// and turns pgx.ErrNoRows into ErrNotFound.
func (c *Core) Op(ctx context.Context, name string) (context.Context, func(error) error) {
	ctx, cancel := context.WithTimeout(ctx, c.opTimeout)
	return ctx, func(err error) error {
		defer cancel()
		if err == nil {
			return nil
		}
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("jobs.%s: %w", name, ErrNotFound)
		}
		if errors.Is(err, context.DeadlineExceeded) && ctx.Err() != nil {
			return fmt.Errorf("jobs.%s timed out after %s: %w", name, c.opTimeout, err)
		}
		return fmt.Errorf("jobs.%s: %w", name, err)
	}
}

// InTx runs fn in a transaction on the Core's handle and commits it when
// fn returns nil. Before COMMIT it checks once that the transaction is
// still open (CheckTxOpen, no round trip): a cascade statement that ended
// it makes the operation fail with ErrTxEnded instead of reporting a write
// that did not commit with the rest. fn holds jobreaper's statements and
// the operator's cascades only, all bounded by ctx (the operation's
// timeout); a failed COMMIT is worded by what became of the transaction
// (CommitOutcome).
func (c *Core) InTx(ctx context.Context, fn func(pgx.Tx) error) error {
	tx, err := c.db.Begin(ctx)
	if err != nil {
		return err
	}
	defer c.Rollback(ctx, tx)
	if err := fn(tx); err != nil {
		return err
	}
	if err := CheckTxOpen(tx, ""); err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return CommitOutcome(err, "")
	}
	return nil
}
