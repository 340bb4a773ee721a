package jobs

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/jobreaper/jobreaper/internal/pgstore"
)

// DaemonOf returns the daemon's store over s's Core (same handle, schema,
// timeout and cascades), for the worker's tests that reap what they
// claimed, as the reaper would.
func DaemonOf(s *Store) *pgstore.Store { return pgstore.FromCore(s.core) }

// LatestVersion exposes latestVersion, the highest embedded migration.
var LatestVersion = latestVersion

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

// Q exposes the Store's Core.Q: sql with {schema} rendered as the Store's
// schema.
func (s *Store) Q(sql string) string { return s.core.Q(sql) }

// The worker's statements by ID whose plans TestWorkerPlansHoldOnStaleStatistics checks.
const (
	HeartbeatSQL      = heartbeatSQL
	CompleteSQL       = completeSQL
	CheckCompletedSQL = checkCompletedSQL
	FailSQL           = failSQL
	ClaimSQL          = claimSQL
	ReleaseSQL        = releaseSQL
	AutoCompleteSQL   = autoCompleteSQL
	AutoStateSQL      = autoStateSQL
	AdvanceLockSQL    = advanceLockSQL
	MoveCursorSQL     = moveCursorSQL
	SetTotalSQL       = setTotalSQL
	ReadStateSQL      = readStateSQL
)
