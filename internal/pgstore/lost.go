package pgstore

import (
	"context"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/jobreaper/jobreaper/internal/pgcore"
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
// Rows the rule cannot judge are returned too, once idle for @min_stall,
// so that the caller counts and reports them instead of never seeing them
// (a PROCESSING row whose task is gone would otherwise stay so for good,
// unreported): infinite timestamps (bad_row), no job_types row
// (unknown_type), no started_at (no_start_time) and unsafe limits
// (bad_limits: a stall timeout under the floor, or a hard_timeout not
// above max_runtime + stall timeout). Decide names each.
const lostCandidatesSQL = `SELECT ` + pgcore.SnapshotColumns + `
  FROM {schema}.jobs j LEFT JOIN {schema}.job_types t ON t.name = j.type
 WHERE j.status = 'PROCESSING'
   AND j.queue = ANY(@queues::text[])
   AND j.updated_at <= now() - @min_stall::interval
   AND (j.updated_at, j.id) > (@after_updated_at::timestamptz, @after_id::text)
   AND (` + StallPredicate + `
        OR NOT (isfinite(j.started_at) AND isfinite(j.updated_at))
        OR t.name IS NULL OR j.started_at IS NULL
        OR NOT (` + limitsSafePredicate + `))
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
	// After is where the previous call stopped (zero: the start). The
	// reaper keeps it across passes, so that rows it skips (awaiting a
	// retry, held) never hide the candidates behind them.
	After LostCursor
}

// LostCursor is a position in the (updated_at, id) order of lost-task
// candidates; the zero value is the start.
type LostCursor struct {
	UpdatedAt time.Time
	ID        string
}

// args sets the keyset arguments @after_updated_at and @after_id of the
// (updated_at, id) pages that start after c (the start: '-infinity', "").
func (c LostCursor) args(args pgx.NamedArgs) {
	args["after_updated_at"] = pgtype.Timestamptz{InfinityModifier: pgtype.NegativeInfinity, Valid: true}
	args["after_id"] = ""
	if !c.UpdatedAt.IsZero() {
		args["after_updated_at"], args["after_id"] = c.UpdatedAt, c.ID
	}
}

// ListLostCandidates returns PROCESSING jobs of p.Queues that are stalled
// by StallPredicate on the database clock and whose ID is not in p.Active,
// least recently updated first, after p.After, at most p.Limit: fewer
// means the end of the candidates was reached. Their tasks are not
// running: the caller must look each task up and reap only those asynq
// will never run again. Rows whose task is active are skipped in Go, page
// after page, so they never hide the rows behind them.
// It returns a wrapped driver error when PostgreSQL fails.
func (s *Store) ListLostCandidates(ctx context.Context, p LostCandidatesParams) ([]pgcore.Snapshot, error) {
	ctx, done := s.core.Op(ctx, "ListLostCandidates")
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
	p.After.args(args)
	var out []pgcore.Snapshot
	for {
		rows, _, err := pgcore.PinnedQuery(ctx, s.core.DB(), s.core.Q(lostCandidatesSQL), args)
		if err != nil {
			return nil, done(err)
		}
		page, err := pgx.CollectRows(rows, pgcore.ScanSnapshot)
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
		args["after_updated_at"], args["after_id"] = pgcore.UpdatedKey(last), last.ID
	}
}

// processingQueuesSQL lists the distinct queues of PROCESSING rows by
// walking the partial index jobs_processing_queue_idx (queue, updated_at)
// one queue at a time (a loose index scan): its cost follows the number of
// queues, not of rows.
const processingQueuesSQL = `
WITH RECURSIVE q(queue) AS (
    (SELECT queue FROM {schema}.jobs WHERE status = 'PROCESSING' AND queue IS NOT NULL ORDER BY queue LIMIT 1)
  UNION ALL
    SELECT (SELECT j.queue FROM {schema}.jobs j
             WHERE j.status = 'PROCESSING' AND j.queue > q.queue ORDER BY j.queue LIMIT 1)
      FROM q WHERE q.queue IS NOT NULL
)
SELECT queue FROM q WHERE queue IS NOT NULL`

// ProcessingQueues returns the distinct queues named by PROCESSING rows,
// sorted: the queues the lost-task search must cover even when asynq no
// longer lists them (its data was lost). It returns a wrapped driver error
// when PostgreSQL fails.
func (s *Store) ProcessingQueues(ctx context.Context) ([]string, error) {
	ctx, done := s.core.Op(ctx, "ProcessingQueues")
	rows, err := s.core.DB().Query(ctx, s.core.Q(processingQueuesSQL))
	if err != nil {
		return nil, done(err)
	}
	qs, err := pgx.CollectRows(rows, pgx.RowTo[string])
	return qs, done(err)
}

// noQueueSQL reads the stalled PROCESSING rows that have no queue, through
// jobs_processing_queue_idx (queue IS NULL).
const noQueueSQL = `SELECT j.id
  FROM {schema}.jobs j JOIN {schema}.job_types t ON t.name = j.type
 WHERE j.status = 'PROCESSING' AND j.queue IS NULL
   AND ` + StallPredicate + `
 ORDER BY j.id
 LIMIT @limit`

// StalledWithoutQueue returns the IDs of at most limit PROCESSING rows
// stalled by StallPredicate that have no queue: their task cannot be
// looked up, so they are never reconciled, only counted. It returns a
// wrapped driver error when PostgreSQL fails.
func (s *Store) StalledWithoutQueue(ctx context.Context, rule StallRule, limit int) ([]string, error) {
	ctx, done := s.core.Op(ctx, "StalledWithoutQueue")
	args := rule.args()
	args["limit"] = limit
	rows, err := s.core.DB().Query(ctx, s.core.Q(noQueueSQL), args)
	if err != nil {
		return nil, done(err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	return ids, done(err)
}
