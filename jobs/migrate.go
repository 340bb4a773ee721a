package jobs

import (
	"context"
	"embed"
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
	sub, err := fs.Sub(migrationFiles, "migrations")
	if err != nil {
		return nil, fmt.Errorf("jobs.Migrate: %w", err)
	}
	h := fnv.New64a()
	_, _ = h.Write([]byte("jobreaper:" + schema))
	locker, err := lock.NewPostgresSessionLocker(lock.WithLockID(int64(h.Sum64() >> 1)))
	if err != nil {
		return nil, fmt.Errorf("jobs.Migrate: %w", err)
	}
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	provider, err := goose.NewProvider(goose.DialectPostgres, db, sub,
		goose.WithSessionLocker(locker),
		goose.WithTableName("jobreaper_schema_version"),
		goose.WithDisableGlobalRegistry(true),
	)
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
