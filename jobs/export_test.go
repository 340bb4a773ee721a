package jobs

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
)

// CheckTxOpen exposes checkTxOpen to the external tests.
var CheckTxOpen = checkTxOpen

// MigrateUpTo applies schema's migrations up to version only, leaving the
// schema as an older release of jobreaper left it, for upgrade tests.
func MigrateUpTo(ctx context.Context, pool *pgxpool.Pool, schema string, version int64) error {
	if _, err := pool.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+pgx.Identifier{schema}.Sanitize()); err != nil {
		return err
	}
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	provider, err := newProvider(db, schema)
	if err != nil {
		return err
	}
	_, err = provider.UpTo(ctx, version)
	return err
}
