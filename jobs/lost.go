package jobs

import (
	"context"
	"slices"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// LostCandidatesLimitDefault bounds how many rows one ListLostCandidates
// call returns, so that a pass after a Redis data loss works through a
// backlog over several passes instead of looking up every task at once.
const LostCandidatesLimitDefault = 500

// lostCandidatesSQL reads one page of stalled PROCESSING rows of the
// listed queues, by the keyset (updated_at, id). Its cost follows the
// stalled rows, not the active tasks: j.status = 'PROCESSING' selects the
// partial index jobs_processing_queue_idx (queue, updated_at), and the
// bound updated_at <= now() - @min_stall, which StallPredicate implies
// (a sane stall timeout is at least @min_stall), keeps the scan to rows idle
// that long. The active tasks are excluded in Go: sending 100,000 IDs to
// anti-join would cost more than the search.
// Rows whose timestamps are infinite (never stalled by the rule) are
// returned too, so that the caller counts them as bad rows instead of
// never seeing them.
const lostCandidatesSQL = `SELECT ` + snapshotColumns + `
  FROM {schema}.jobs j JOIN {schema}.job_types t ON t.name = j.type
 WHERE j.status = 'PROCESSING'
   AND j.queue = ANY(@queues::text[])
   AND j.updated_at <= now() - @min_stall::interval
   AND (j.updated_at, j.id) > (@after_updated_at::timestamptz, @after_id::text)
   AND (` + StallPredicate + `
        OR NOT (isfinite(j.started_at) AND isfinite(j.updated_at)))
 ORDER BY j.updated_at, j.id
 LIMIT @limit`

// LostCandidatesParams selects the stalled jobs whose task was not among
// the active ones.
type LostCandidatesParams struct {
	// Queues whose active tasks were listed completely this pass; rows of
	// other queues, and rows without a queue, are never returned.
	Queues []string
	// Active holds the IDs of every active task listed in those queues
	// (sorted is cheapest; an unsorted list is sorted in a copy).
	Active []string
	Rule   StallRule
	// Limit is the most rows returned (LostCandidatesLimitDefault when 0).
	Limit int
}

// ListLostCandidates returns PROCESSING jobs of p.Queues that are stalled
// by StallPredicate on the database clock and whose ID is not in p.Active,
// least recently updated first, at most p.Limit. Their tasks are not
// running: the caller must look each task up and reap only those asynq
// will never run again. Rows whose task is active are skipped in Go, page
// after page, so they never hide the rows behind them.
// It returns a wrapped driver error when PostgreSQL fails.
func (s *Store) ListLostCandidates(ctx context.Context, p LostCandidatesParams) ([]Snapshot, error) {
	ctx, done := s.op(ctx, "ListLostCandidates")
	if len(p.Queues) == 0 {
		return nil, done(nil)
	}
	limit := p.Limit
	if limit <= 0 {
		limit = LostCandidatesLimitDefault
	}
	active := p.Active
	if !slices.IsSorted(active) {
		active = slices.Sorted(slices.Values(active))
	}
	args := p.Rule.args()
	args["queues"], args["limit"] = p.Queues, limit
	args["after_updated_at"] = pgtype.Timestamptz{InfinityModifier: pgtype.NegativeInfinity, Valid: true}
	args["after_id"] = ""
	var out []Snapshot
	for {
		rows, _, err := pinnedQuery(ctx, s.db, s.q(lostCandidatesSQL), args)
		if err != nil {
			return nil, done(err)
		}
		page, err := pgx.CollectRows(rows, scanSnapshot)
		if err != nil {
			return nil, done(err)
		}
		for _, sn := range page {
			if _, isActive := slices.BinarySearch(active, sn.ID); !isActive {
				out = append(out, sn)
			}
			if len(out) == limit {
				return out, done(nil)
			}
		}
		if len(page) < limit {
			return out, done(nil)
		}
		last := page[len(page)-1]
		args["after_updated_at"], args["after_id"] = last.updatedKey, last.ID
	}
}
