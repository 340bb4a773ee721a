package jobs

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"hash/fnv"
	"io/fs"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

// Migrate creates the schema named by schema if it is missing and applies
// every pending migration to it. It is idempotent: a second run applies
// nothing. Concurrent runs against one schema serialise on a PostgreSQL
// advisory lock derived from the schema name, so two sidecars starting at
// once do not race.
//
// It returns the versions applied (empty when the schema was current) and an
// error wrapping the driver's when PostgreSQL cannot be reached or a
// migration fails.
func Migrate(ctx context.Context, pool *pgxpool.Pool, schema string) ([]int64, error) {
	if _, err := pool.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+pgx.Identifier{schema}.Sanitize()); err != nil {
		return nil, fmt.Errorf("jobs.Migrate: creating schema %q: %w", schema, err)
	}
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	provider, err := newProvider(db, schema)
	if err != nil {
		return nil, fmt.Errorf("jobs.Migrate: %w", err)
	}
	results, err := provider.Up(ctx)
	if err != nil {
		return nil, fmt.Errorf("jobs.Migrate: applying migrations to schema %q: %w", schema, err)
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

// newProvider returns the goose provider of this package's embedded
// migrations for schema. Concurrent Ups against one schema serialise on a
// PostgreSQL advisory lock derived from the schema name.
func newProvider(db *sql.DB, schema string) (*goose.Provider, error) {
	sub, err := fs.Sub(migrationFiles, "migrations")
	if err != nil {
		return nil, err
	}
	h := fnv.New64a()
	_, _ = h.Write([]byte("jobreaper:" + schema))
	locker, err := lock.NewPostgresSessionLocker(lock.WithLockID(int64(h.Sum64() >> 1)))
	if err != nil {
		return nil, err
	}
	return goose.NewProvider(goose.DialectPostgres, db, sub,
		goose.WithSessionLocker(locker),
		goose.WithTableName(SchemaVersionTable),
		goose.WithDisableGlobalRegistry(true),
	)
}

// ErrNotMigrated is returned by CheckMigrated when the schema lacks
// migrations this binary ships: run Migrate (jobreaper migrate) first.
var ErrNotMigrated = errors.New("schema is not migrated to this version of jobreaper")

// CheckMigrated returns nil when schema has every migration this binary
// ships, an error wrapping ErrNotMigrated that names the versions when it
// does not (or has none), and a wrapped driver error when PostgreSQL
// fails. It writes nothing: the daemon calls it at start so that a
// forgotten migration stops it there instead of failing every pass.
func CheckMigrated(ctx context.Context, pool *pgxpool.Pool, schema string) error {
	var exists bool
	if err := pool.QueryRow(ctx, `SELECT to_regclass(format('%I.%I', $1::text, $2::text)) IS NOT NULL`,
		schema, SchemaVersionTable).Scan(&exists); err != nil {
		return fmt.Errorf("jobs.CheckMigrated: %w", err)
	}
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	provider, err := newProvider(db, schema)
	if err != nil {
		return fmt.Errorf("jobs.CheckMigrated: %w", err)
	}
	sources := provider.ListSources()
	latest := sources[len(sources)-1].Version
	if !exists {
		return fmt.Errorf("jobs.CheckMigrated: schema %q has no jobreaper tables (this binary ships version %d): %w", schema, latest, ErrNotMigrated)
	}
	var current int64
	if err := pool.QueryRow(ctx, `SELECT coalesce(max(version_id), 0) FROM `+
		pgx.Identifier{schema, SchemaVersionTable}.Sanitize()+` WHERE is_applied`).Scan(&current); err != nil {
		return fmt.Errorf("jobs.CheckMigrated: %w", err)
	}
	if current < latest {
		return fmt.Errorf("jobs.CheckMigrated: schema %q is at version %d, this binary needs %d: %w", schema, current, latest, ErrNotMigrated)
	}
	return nil
}
