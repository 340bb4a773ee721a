package jobs

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"hash/fnv"
	"io/fs"
	"path"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/database"

	"github.com/jobreaper/jobreaper/internal/idcheck"
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

// Migrate creates the schema named by schema if it is missing and applies
// every pending migration to it. It is idempotent: a second run applies
// nothing. Concurrent runs against one schema serialise on a PostgreSQL
// advisory lock derived from the schema name, so two sidecars starting at
// once do not race.
//
// It relies on no search_path: each migration runs in its own transaction
// that begins with SET LOCAL search_path to schema alone, and goose's
// version table is named with its schema. The lock is a transaction-level
// advisory lock held by one open transaction for the whole run, so Migrate
// works the same on a direct connection and through a transaction-mode
// pooler (where a session-level lock or SET would land on whichever server
// connection the pooler picked).
//
// Before it creates anything it looks for tables, indexes and functions
// that a pending migration would create and that already exist in schema
// without being jobreaper's (a product's own jobs table, typically); if
// there are any it changes nothing, not even the version table, and
// returns an error wrapping ErrSchemaConflict that names them.
//
// It returns the versions applied (empty when the schema was current); an
// error wrapping ErrBadSchema (nothing connected) for a schema that is not
// a plain identifier or is PostgreSQL's own (information_schema, pg_*); an
// error wrapping the driver's when PostgreSQL cannot be reached or a
// migration fails.
func Migrate(ctx context.Context, pool *pgxpool.Pool, schema string) ([]int64, error) {
	if !idcheck.ValidSchema(schema) {
		return nil, fmt.Errorf("jobs.Migrate: schema %q: %w", schema, ErrBadSchema)
	}
	if idcheck.SystemSchema(schema) {
		return nil, fmt.Errorf("jobs.Migrate: schema %q is PostgreSQL's own (information_schema and pg_* are reserved): %w", schema, ErrBadSchema)
	}
	// The lock transaction stays open (holding its server connection, even
	// behind a pooler) until every migration has committed.
	lockTx, err := pool.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("jobs.Migrate: %w", err)
	}
	defer func() { _ = lockTx.Rollback(context.WithoutCancel(ctx)) }()
	if _, err := lockTx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, migrateLockID(schema)); err != nil {
		return nil, fmt.Errorf("jobs.Migrate: waiting for the migration lock of schema %q: %w", schema, err)
	}
	// A schema already at this binary's version needs nothing, not even
	// CREATE SCHEMA IF NOT EXISTS, which PostgreSQL refuses to a role
	// without CREATE on the database although the schema exists: so the
	// daemon's least-privilege role may run migrate at every start (the
	// systemd unit's ExecStartPre, the Kubernetes init container).
	if schemaCurrent(ctx, lockTx, schema) {
		if err := lockTx.Commit(ctx); err != nil {
			return nil, fmt.Errorf("jobs.Migrate: releasing the migration lock of schema %q: %w", schema, err)
		}
		return []int64{}, nil
	}
	// Checked under the lock and before anything is created, so a refused
	// run leaves no schema and no version table behind.
	if err := checkConflicts(ctx, lockTx, schema); err != nil {
		return nil, fmt.Errorf("jobs.Migrate: %w", err)
	}
	// Created after the lock: two concurrent CREATE SCHEMA IF NOT EXISTS
	// can both try to insert it, and one fails.
	if _, err := pool.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+pgx.Identifier{schema}.Sanitize()); err != nil {
		return nil, fmt.Errorf("jobs.Migrate: creating schema %q: %w%s", schema, err, privilegeHint(err))
	}
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	provider, err := newProvider(db, schema)
	if err != nil {
		return nil, fmt.Errorf("jobs.Migrate: %w", err)
	}
	results, err := provider.Up(ctx)
	if err != nil {
		return nil, fmt.Errorf("jobs.Migrate: applying migrations to schema %q: %w%s", schema, err, privilegeHint(err))
	}
	if err := lockTx.Commit(ctx); err != nil {
		return nil, fmt.Errorf("jobs.Migrate: releasing the migration lock of schema %q: %w", schema, err)
	}
	applied := make([]int64, 0, len(results))
	for _, r := range results {
		applied = append(applied, r.Source.Version)
	}
	return applied, nil
}

// SchemaVersionTable is the table, in the migrated schema, where Migrate
// records the applied migrations.
const SchemaVersionTable = "jobreaper_schema_version"

// migrateLockID is the advisory lock key of Migrate for schema. Earlier
// versions took the same key as a session lock; session and transaction
// advisory locks share one key space, so old and new binaries still
// exclude each other.
func migrateLockID(schema string) int64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte("jobreaper:" + schema))
	return int64(h.Sum64() >> 1)
}

// newProvider returns the goose provider of this package's embedded
// migrations for schema. Each file becomes a migration that runs, in its
// own transaction, SET LOCAL search_path to schema and then the file's Up
// section, so its unqualified names land in schema whatever the
// connection's search_path. A file that asks for no transaction is
// refused: it could not be confined to schema this way.
func newProvider(db *sql.DB, schema string) (*goose.Provider, error) {
	migrations, err := schemaMigrations(schema)
	if err != nil {
		return nil, err
	}
	inner, err := database.NewStore(database.DialectPostgres, pgx.Identifier{schema, SchemaVersionTable}.Sanitize())
	if err != nil {
		return nil, err
	}
	return goose.NewProvider(goose.DialectCustom, db, nil,
		goose.WithStore(versionStore{Store: inner}),
		goose.WithGoMigrations(migrations...),
		goose.WithDisableGlobalRegistry(true),
	)
}

// versionStore is goose's PostgreSQL version store under a quoted,
// schema-qualified table name. Its TableExists asks to_regclass about that
// name: goose's own check splits the name on "." and compares the quoted
// parts with pg_tables verbatim, which never matches.
type versionStore struct{ database.Store }

func (v versionStore) TableExists(ctx context.Context, db database.DBTxConn) (bool, error) {
	var exists bool
	err := db.QueryRowContext(ctx, `SELECT to_regclass($1) IS NOT NULL`, v.Tablename()).Scan(&exists)
	return exists, err
}

// schemaMigrations turns the embedded migration files into goose
// migrations confined to schema (see newProvider).
func schemaMigrations(schema string) ([]*goose.Migration, error) {
	files, err := fs.Glob(migrationFiles, "migrations/*.sql")
	if err != nil {
		return nil, err
	}
	setPath := "SET LOCAL search_path TO " + pgx.Identifier{schema}.Sanitize()
	out := make([]*goose.Migration, 0, len(files))
	for _, name := range files {
		base := path.Base(name)
		version, err := strconv.ParseInt(strings.SplitN(base, "_", 2)[0], 10, 64)
		if err != nil || version < 1 {
			return nil, fmt.Errorf("migration %s: the name must start with a positive version number", base)
		}
		text, err := migrationFiles.ReadFile(name)
		if err != nil {
			return nil, err
		}
		up, down, err := splitMigration(string(text))
		if err != nil {
			return nil, fmt.Errorf("migration %s: %w", base, err)
		}
		run := func(body string) *goose.GoFunc {
			return &goose.GoFunc{RunTx: func(ctx context.Context, tx *sql.Tx) error {
				if _, err := tx.ExecContext(ctx, setPath); err != nil {
					return err
				}
				// No arguments: pgx sends the text with the simple
				// protocol, several statements in one round trip.
				_, err := tx.ExecContext(ctx, body)
				return err
			}}
		}
		out = append(out, goose.NewGoMigration(version, run(up), run(down)))
	}
	return out, nil
}

// splitMigration returns the Up and Down sections of a goose SQL file.
func splitMigration(text string) (up, down string, err error) {
	if strings.Contains(text, "-- +goose NO TRANSACTION") {
		return "", "", errors.New("runs without a transaction, which Migrate does not support")
	}
	_, rest, ok := strings.Cut(text, "-- +goose Up")
	if !ok {
		return "", "", errors.New(`has no "-- +goose Up" line`)
	}
	up, down, _ = strings.Cut(rest, "-- +goose Down")
	return up, down, nil
}

// ErrNotMigrated is returned by Store.CheckSchema when
// the schema lacks jobreaper's tables or migrations this binary ships: run
// Migrate (jobreaper migrate --schema <name>) first.
var ErrNotMigrated = errors.New("schema is not migrated to this version of jobreaper")

// privilegeHint says, for PostgreSQL's insufficient_privilege (42501), that
// migrations need a role that may create objects: the role that owns
// jobreaper's tables, not the daemon's or the workers' least-privilege
// roles (deploy/sql/roles.sql), which only run statements.
func privilegeHint(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42501" {
		return " (migrate needs a role that may create in the database and the schema, such as the owner of jobreaper's tables; the reaper and worker roles of deploy/sql/roles.sql cannot migrate)"
	}
	return ""
}

// schemaCurrent reports whether schema holds jobreaper's tables at this
// binary's version. It reads inside a savepoint of tx, so that a failed
// read leaves tx usable.
func schemaCurrent(ctx context.Context, tx pgx.Tx, schema string) bool {
	sp, err := tx.Begin(ctx)
	if err != nil {
		return false
	}
	defer func() { _ = sp.Rollback(ctx) }()
	return checkSchema(ctx, sp, schema) == nil
}
