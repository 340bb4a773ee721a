package pgstore

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/jobreaper/jobreaper/internal/pgcore"
)

// StaleQueued is a QUEUED row that has waited longer than the caller's
// bound: its queue (QueueDefault when NULL) and its keyset position.
type StaleQueued struct {
	ID    string
	Queue string
	// UpdatedAt is the row's updated_at: when it became QUEUED.
	UpdatedAt time.Time
}

// StaleCursor is a position in the (updated_at, id) order of QUEUED rows;
// the zero value is the start.
type StaleCursor struct {
	UpdatedAt time.Time
	ID        string
}

// StaleQueuedParams selects one page of ListStaleQueued.
type StaleQueuedParams struct {
	// Older is how long a row must have been QUEUED (updated_at before
	// now() - Older, on the database clock).
	Older time.Duration
	// Queues restricts the rows to these queues; empty: every queue. A
	// NULL queue counts as QueueDefault.
	Queues []string
	// After is the last row of the previous page (zero: from the start).
	After StaleCursor
	// Limit is the most rows returned; at least 1.
	Limit int
}

// staleQueuedSQL pages QUEUED rows by (updated_at, id) through the partial
// index jobs_queued_updated_idx; the age bound ends the range scan.
const staleQueuedSQL = `
SELECT id, coalesce(queue, @default_queue), updated_at
  FROM {schema}.jobs
 WHERE status = 'QUEUED'
   AND updated_at < now() - @older::interval AND updated_at > '-infinity'
   AND (updated_at, id) > (@after_updated_at::timestamptz, @after_id::text)
   AND (cardinality(@queues::text[]) = 0 OR coalesce(queue, @default_queue) = ANY(@queues::text[]))
 ORDER BY updated_at, id
 LIMIT @limit`

// QueueDefault is the asynq queue of a row whose queue is NULL (asynq's
// own default queue, where queue.Enqueue puts such a job's task).
const QueueDefault = "default"

// ListStaleQueued returns one page of rows QUEUED for longer than
// p.Older, in (updated_at, id) order after p.After, at most p.Limit.
// A page shorter than p.Limit is the last. It returns
// pgcore.ErrInvalidArgument for a Limit below 1, and a wrapped driver error when
// PostgreSQL fails.
func (s *Store) ListStaleQueued(ctx context.Context, p StaleQueuedParams) ([]StaleQueued, error) {
	if p.Limit < 1 {
		return nil, fmt.Errorf("jobs.ListStaleQueued: %w: limit %d", pgcore.ErrInvalidArgument, p.Limit)
	}
	ctx, done := s.core.Op(ctx, "ListStaleQueued")
	after := any(p.After.UpdatedAt)
	if p.After.UpdatedAt.IsZero() {
		after = "-infinity"
	}
	queues := p.Queues
	if queues == nil {
		queues = []string{}
	}
	rows, err := s.core.DB().Query(ctx, s.core.Q(staleQueuedSQL), pgx.NamedArgs{
		"default_queue": QueueDefault, "older": pgcore.Interval(p.Older), "after_updated_at": after, "after_id": p.After.ID,
		"queues": queues, "limit": p.Limit,
	})
	if err != nil {
		return nil, done(err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (StaleQueued, error) {
		var sq StaleQueued
		return sq, row.Scan(&sq.ID, &sq.Queue, &sq.UpdatedAt)
	})
	return out, done(err)
}
