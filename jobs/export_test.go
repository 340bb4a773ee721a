package jobs

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/jobreaper/jobreaper/internal/pgcore"
)

// SetBeforeReapCommit makes s call f in each of its reap transactions
// after the leader lease check, just before COMMIT: where a leader paused
// by the operating system or the runtime would stop.
func SetBeforeReapCommit(s *Store, f func()) { s.beforeReapCommit = f }

// LeaderIdleBoundSQL exposes the reap transaction's idle bound statement.
const LeaderIdleBoundSQL = leaderIdleBoundSQL

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

// The statements whose plans TestPlansHoldOnStaleStatistics checks.
const (
	LoadSQL           = loadSQL
	ReapBatchSQL      = reapBatchSQL
	ReapLockSQL       = reapLockSQL
	MarkersSetSQL     = markersSetSQL
	MarkersFailedSQL  = markersFailedSQL
	LostCandidatesSQL = lostCandidatesSQL
	ReadStateSQL      = readStateSQL
	PinPlansSQL       = pgcore.PinPlansSQL
)

// Args exposes the stall rule's named arguments.
func (r StallRule) Args() map[string]any { return r.args() }

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
	RequeueSQL        = requeueSQL
)

// The reconciliation's statements whose plans TestReconcilePlansUseTheirIndexes checks.
const (
	ReapedSQL           = reapedSQL
	ReapedCountSQL      = reapedCountSQL
	StaleQueuedSQL      = staleQueuedSQL
	ProcessingQueuesSQL = processingQueuesSQL
	NoQueueSQL          = noQueueSQL
)

// Pending exposes whether w saw connection-level failures that no
// PassClock recorded yet.
func (w *ConnWatch) Pending() bool {
	_, _, ok := w.pending()
	return ok
}
