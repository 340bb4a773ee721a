package pgstore

import (
	"context"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/jobreaper/jobreaper/internal/pgcore"
)

// DeadEarlyPredicate is the database side of the dead-early rule as SQL
// over jobs j joined with job_types t, on the database clock: the job is
// PROCESSING with a start time, its type opted in (reap_dead_early), its
// type's limits are sane (as in StallPredicate), and its idle time,
// counted from the later of updated_at and @outage_end, is at least its
// stall timeout. Its runtime is not compared: that is the point. The rest
// of the rule (asynq expired the task's lease, a live server serves its
// queue, the claiming worker is absent from asynq's registry) is asynq's
// side, which SQL cannot see; reaper.DecideDeadEarly states both sides.
const DeadEarlyPredicate = `
      j.status COLLATE "C" = 'PROCESSING'
  AND j.started_at IS NOT NULL
  AND t.reap_dead_early
  AND coalesce(t.stall_timeout, @default_stall) >= @min_stall
  AND extract(epoch FROM coalesce(t.hard_timeout, @default_hard)) - 453600 * extract(year FROM coalesce(t.hard_timeout, @default_hard))
    > extract(epoch FROM t.max_runtime) - 453600 * extract(year FROM t.max_runtime)
    + extract(epoch FROM coalesce(t.stall_timeout, @default_stall)) - 453600 * extract(year FROM coalesce(t.stall_timeout, @default_stall))
  AND CASE WHEN isfinite(j.started_at) AND isfinite(j.updated_at)
           THEN now() - greatest(j.updated_at, @outage_end::timestamptz) >= coalesce(t.stall_timeout, @default_stall)
      END`

// reapBatchDeadEarlySQL is reapBatchSQL with DeadEarlyPredicate in place
// of StallPredicate: the compare-and-set of a dead-early reap re-checks
// the status, generation and updated_at read, the type's opt-in and the
// idle time on now().
var reapBatchDeadEarlySQL = strings.Replace(reapBatchSQL, StallPredicate, DeadEarlyPredicate, 1)

// DeadEarlyLimitDefault bounds how many rows one ListDeadEarlyCandidates
// call returns.
const DeadEarlyLimitDefault = 500

// deadEarlyCandidatesSQL reads one page of PROCESSING rows of the listed
// queues whose type opted into dead-early reaps, that DeadEarlyPredicate
// holds for but StallPredicate's runtime bound does not yet (those are the
// lost-task search's), by the keyset (updated_at, id).
const deadEarlyCandidatesSQL = `SELECT ` + pgcore.SnapshotColumns + `
  FROM {schema}.jobs j JOIN {schema}.job_types t ON t.name = j.type
 WHERE j.status = 'PROCESSING'
   AND j.queue = ANY(@queues::text[])
   AND j.updated_at <= now() - @min_stall::interval
   AND (j.updated_at, j.id) > (@after_updated_at::timestamptz, @after_id::text)
   AND ` + DeadEarlyPredicate + `
   AND now() - j.started_at <= t.max_runtime
 ORDER BY j.updated_at, j.id
 LIMIT @limit`

// DeadEarlyCandidatesParams selects one page of ListDeadEarlyCandidates.
type DeadEarlyCandidatesParams struct {
	// Queues whose active tasks were listed completely this pass.
	Queues []string
	Rule   StallRule
	// Limit is the most rows returned (DeadEarlyLimitDefault when 0).
	Limit int
	// After is where the previous call stopped (zero: the start).
	After LostCursor
}

// ListDeadEarlyCandidates returns PROCESSING jobs of p.Queues whose type
// has reap_dead_early set and that DeadEarlyPredicate holds for on the
// database clock, whose runtime has not passed max_runtime (past it, the
// full rule's lost-task search takes them), least recently updated first,
// after p.After, at most p.Limit: fewer means the end was reached. Every
// row returned belongs to a type that opted in; the caller must still
// check asynq's side of the rule before reaping. It returns a wrapped
// driver error when PostgreSQL fails.
func (s *Store) ListDeadEarlyCandidates(ctx context.Context, p DeadEarlyCandidatesParams) ([]pgcore.Snapshot, error) {
	ctx, done := s.core.Op(ctx, "ListDeadEarlyCandidates")
	if len(p.Queues) == 0 {
		return nil, done(nil)
	}
	limit := p.Limit
	if limit <= 0 {
		limit = DeadEarlyLimitDefault
	}
	args := p.Rule.args()
	args["queues"], args["limit"] = p.Queues, limit
	p.After.args(args)
	rows, err := s.core.DB().Query(ctx, s.core.Q(deadEarlyCandidatesSQL), args)
	if err != nil {
		return nil, done(err)
	}
	out, err := pgx.CollectRows(rows, pgcore.ScanSnapshot)
	return out, done(err)
}
