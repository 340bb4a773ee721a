package jobs

import (
	"context"

	"github.com/jackc/pgx/v5"
)

// LostCandidatesLimitDefault bounds how many rows one ListLostCandidates
// call returns, so that a pass after a Redis data loss works through a
// backlog over several passes instead of looking up every task at once.
const LostCandidatesLimitDefault = 500

const lostCandidatesSQL = `SELECT ` + snapshotColumns + `
  FROM {schema}.jobs j JOIN {schema}.job_types t ON t.name = j.type
 WHERE j.queue = ANY(@queues)
   AND NOT EXISTS (SELECT 1 FROM unnest(@active::text[]) AS a(id) WHERE a.id = j.id)
   AND ` + StallPredicate + `
 ORDER BY j.updated_at, j.id
 LIMIT @limit`

// LostCandidatesParams selects the stalled jobs whose task was not among
// the active ones.
type LostCandidatesParams struct {
	// Queues whose active tasks were listed completely this pass; rows of
	// other queues, and rows without a queue, are never returned.
	Queues []string
	// Active holds the IDs of every active task listed in those queues.
	Active []string
	Rule   StallRule
	// Limit is the most rows returned (LostCandidatesLimitDefault when 0).
	Limit int
}

// ListLostCandidates returns PROCESSING jobs of p.Queues that are stalled
// by StallPredicate on the database clock and whose ID is not in p.Active,
// least recently updated first. Their tasks are not running: the caller
// must look each task up and reap only those asynq will never run again.
// It returns a wrapped driver error when PostgreSQL fails.
func (s *Store) ListLostCandidates(ctx context.Context, p LostCandidatesParams) ([]Snapshot, error) {
	ctx, done := s.op(ctx, "ListLostCandidates")
	if len(p.Queues) == 0 {
		return nil, done(nil)
	}
	args := p.Rule.args()
	// A nil Active is NULL, whose unnest() is empty: it excludes nothing.
	args["queues"], args["active"] = p.Queues, p.Active
	args["limit"] = p.Limit
	if p.Limit <= 0 {
		args["limit"] = LostCandidatesLimitDefault
	}
	rows, err := s.db.Query(ctx, s.q(lostCandidatesSQL), args)
	if err != nil {
		return nil, done(err)
	}
	snaps, err := pgx.CollectRows(rows, scanSnapshot)
	return snaps, done(err)
}
