package pgstore

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/jobreaper/jobreaper/internal/pgcore"
)

// RetryPendingLimitDefault bounds how many retry-reaped rows one
// ListRetryPending call returns.
const RetryPendingLimitDefault = 500

// retryPendingSQL reads one page, by ID, of the QUEUED rows a retry reap
// put back whose next attempt has not started: reap_count > 0 and status
// QUEUED select the partial index jobs_reap_retry_idx (few rows: those
// waiting for a retry, and requeued ones), and the row's latest reaped
// event (the status compared under COLLATE "C", as the index's predicate
// is, so that jobs_queued_updated_idx never serves it), at the generation below the row's, must be a retry (a requeue
// raises the generation again, so a requeued row never matches). Rows
// retry-reaped less than @settle ago are left to the reap's own
// after-commit action.
const retryPendingSQL = `
SELECT j.id, j.type, j.queue, j.generation, j.reap_count, t.reap_retries, t.reap_retry_delay,
       coalesce(e.detail->>'reason', ''), coalesce(j.worker, ''), j.started_at, j.updated_at
  FROM {schema}.jobs j
  JOIN {schema}.job_types t ON t.name = j.type
  CROSS JOIN LATERAL (
        SELECT ev.detail, ev.at FROM {schema}.job_events ev
         WHERE ev.job_id = j.id AND ev.kind = 'reaped' AND ev.generation = j.generation - 1
         ORDER BY ev.id DESC LIMIT 1) e
 WHERE j.status COLLATE "C" = 'QUEUED' AND j.reap_count > 0
   AND j.queue = ANY(@queues::text[])
   AND j.id > @after::text
   AND e.detail->>'retry' = 'true'
   AND e.at <= now() - @settle::interval
 ORDER BY j.id
 LIMIT @limit`

// RetryPendingParams selects retry-reaped rows to finish.
type RetryPendingParams struct {
	// Queues whose rows are read; rows without a queue are never returned.
	Queues []string
	// Settle is how long ago the retry reap must have been.
	Settle time.Duration
	// After is the ID the previous page ended at ("" for the start).
	After string
	// Limit is the most rows returned (RetryPendingLimitDefault when 0).
	Limit int
}

// RetryPending is a QUEUED row a retry reap put back, not claimed since.
type RetryPending struct {
	JobID, Type, Queue string
	// Generation is the row's (the reaped attempt's + 1).
	Generation int64
	// ReapCount is the row's reap_count, ReapRetries its type's budget,
	// RetryDelay its type's reap_retry_delay.
	ReapCount, ReapRetries int
	RetryDelay             time.Duration
	// Reason is the retry reap's reason: stalled or lost_task.
	Reason string
	// Worker, StartedAt and UpdatedAt are the reaped attempt's, as the row
	// still holds them.
	Worker    string
	StartedAt *time.Time
	UpdatedAt time.Time
}

// ListRetryPending returns, by ID after p.After, at most p.Limit retry-reaped
// QUEUED rows of p.Queues whose retry reap is at least p.Settle old; fewer
// than the limit means the end was reached. It returns a wrapped driver
// error when PostgreSQL fails.
func (s *Store) ListRetryPending(ctx context.Context, p RetryPendingParams) ([]RetryPending, error) {
	ctx, done := s.core.Op(ctx, "ListRetryPending")
	if len(p.Queues) == 0 {
		return nil, done(nil)
	}
	limit := p.Limit
	if limit <= 0 {
		limit = RetryPendingLimitDefault
	}
	rows, err := s.core.DB().Query(ctx, s.core.Q(retryPendingSQL), pgx.NamedArgs{
		"queues": p.Queues, "after": p.After, "settle": pgcore.Interval(p.Settle), "limit": limit,
	})
	if err != nil {
		return nil, done(err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (RetryPending, error) {
		var (
			r              RetryPending
			count, retries int32
			delay          pgtype.Interval
			started        pgtype.Timestamptz
			updated        pgtype.Timestamptz
		)
		err := row.Scan(&r.JobID, &r.Type, &r.Queue, &r.Generation, &count, &retries, &delay, &r.Reason, &r.Worker, &started, &updated)
		r.ReapCount, r.ReapRetries, r.RetryDelay = int(count), int(retries), pgcore.IntervalDuration(delay)
		if started.Valid && started.InfinityModifier == pgtype.Finite {
			t := started.Time
			r.StartedAt = &t
		}
		if updated.InfinityModifier == pgtype.Finite {
			r.UpdatedAt = updated.Time
		}
		return r, err
	})
	return out, done(err)
}

// failRetrySQL fails retry-reaped rows whose task is gone, by the
// compare-and-set on what was read: still QUEUED, at the same generation
// and reap_count (not claimed, requeued or reaped since). Rows are named
// by the primary key alone (the status under COLLATE "C", as in
// StallPredicate).
const failRetrySQL = `
UPDATE {schema}.jobs j
   SET status = 'FAILED', failure_reason = r.reason, finished_at = now(), marker_set_at = now()
  FROM unnest(@ids::text[], @generations::int8[], @counts::int4[], @reasons::text[]) AS r(id, generation, reap_count, reason),
       {schema}.job_types t
 WHERE j.id = ANY(@ids::text[])
   AND r.id = j.id
   AND t.name = j.type
   AND j.status COLLATE "C" = 'QUEUED'
   AND j.generation = r.generation
   AND j.reap_count = r.reap_count
RETURNING j.id, j.generation, coalesce(j.worker, ''), j.type, coalesce(j.parent_id, ''), coalesce(j.tenant_id, ''),
          j.started_at, j.updated_at, now(), r.reason, j.reap_count, t.reap_retries`

// FailRetryImpossible fails, in one transaction fenced like a reap (row
// locks in ID order, a compare-and-set on status QUEUED, generation and
// reap_count as read, the leader lease checked before COMMIT), the
// retry-reaped jobs of pending whose task asynq no longer holds: each
// becomes FAILED with its retry reap's reason, gets a reaped event at its
// current generation whose detail carries reap_retry_impossible, and its
// on_failed cascade runs. It returns the jobs failed, in ID order; a job
// that changed since the read is left out. The caller writes their
// markers (at Evidence.Generation, the row's). Errors as ReapBatch's
// (nothing written); a cascade that fails fails the whole call.
func (s *Store) FailRetryImpossible(ctx context.Context, pending []RetryPending) ([]ReapedJob, error) {
	ctx, done := s.core.Op(ctx, "FailRetryImpossible")
	if len(pending) > ReapBatchSize {
		return nil, done(fmt.Errorf("%d jobs, more than ReapBatchSize %d: %w", len(pending), ReapBatchSize, pgcore.ErrInvalidArgument))
	}
	if len(pending) == 0 {
		return nil, done(nil)
	}
	n := len(pending)
	ids, gens, counts, reasons := make([]string, n), make([]int64, n), make([]int32, n), make([]string, n)
	for i, p := range pending {
		ids[i], gens[i], counts[i], reasons[i] = p.JobID, p.Generation, int32(p.ReapCount), p.Reason
		if reasons[i] == "" {
			reasons[i] = ReasonStalled
		}
	}
	var failed []ReapedJob
	err := s.core.InTx(ctx, func(tx pgx.Tx) error {
		pre := append(s.leaderIdleBound(), pgcore.Before{SQL: s.core.Q(reapLockSQL), Args: []any{pgx.NamedArgs{"ids": ids}}})
		rows, saved, err := pgcore.PinnedQuery(ctx, tx, s.core.Q(failRetrySQL),
			pgx.NamedArgs{"ids": ids, "generations": gens, "counts": counts, "reasons": reasons}, pre...)
		if err != nil {
			return err
		}
		failed, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (ReapedJob, error) {
			var (
				r                ReapedJob
				parent, tenant   string
				started, updated pgtype.Timestamptz
				count, retries   int32
			)
			ev := &r.Evidence
			err := row.Scan(&r.JobID, &ev.Generation, &ev.Worker, &r.Type, &parent, &tenant, &started, &updated, &ev.DBNow,
				&ev.Reason, &count, &retries)
			if started.InfinityModifier == pgtype.Finite {
				ev.StartedAt = started.Time
			}
			if updated.InfinityModifier == pgtype.Finite {
				ev.UpdatedAt = updated.Time
			}
			ev.ReapCount, ev.ReapRetries, ev.ReapRetryImpossible = int(count), int(retries), true
			r.parentID, r.tenantID = parent, tenant
			return r, err
		})
		if err != nil || len(failed) == 0 {
			return err
		}
		sortReaped(failed)
		if _, err := s.reapFollowUps(ctx, tx, failed, saved); err != nil {
			return err
		}
		return s.checkLeaderLease(ctx, tx)
	})
	if err != nil {
		return nil, done(err)
	}
	return failed, done(nil)
}
