package pgstore

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/jobreaper/jobreaper/internal/pgcore"
)

// MarkerReasons are the failure reasons whose jobs have a marker: the
// reaper's stalled and lost_task, and an operator's cancelled (jobreaper
// cancel). Marker re-assertion covers exactly these; reapedSQL and the
// index jobs_reaped_window_idx name the same three.
var MarkerReasons = []string{ReasonStalled, ReasonLostTask, ReasonCancelled}

// Reaped is a job reaped within the marker's lifetime, for marker
// re-assertion.
type Reaped struct {
	JobID      string
	Generation int64
	// ReapedAt is finished_at, on the database clock: the marker's 7 days
	// run from it.
	ReapedAt time.Time
	// MarkerConfirmed: marker_set_at is set (the marker was written once).
	MarkerConfirmed bool
}

// ReapedCursor is a position in the (finished_at, id) order of reaped
// jobs; the zero value is the start.
type ReapedCursor struct {
	ReapedAt time.Time
	ID       string
}

// ReapedParams selects one page of ListReaped.
type ReapedParams struct {
	// Now is the pass's reading of the database clock; Within before it
	// bounds the window (the marker's lifetime).
	Now    time.Time
	Within time.Duration
	After  ReapedCursor
	// Limit is the most rows returned; at least 1.
	Limit int
}

// reapedSQL pages the reaped jobs of the window by (finished_at, id)
// through the partial index jobs_reaped_window_idx, whose predicate the
// WHERE repeats word for word.
const reapedSQL = `
SELECT id, generation, finished_at, marker_set_at IS NOT NULL
  FROM {schema}.jobs
 WHERE status = 'FAILED' AND failure_reason IN ('stalled', 'lost_task', 'cancelled')
   AND finished_at > @now::timestamptz - @within::interval AND finished_at < 'infinity'
   AND (finished_at, id) > (@after_at::timestamptz, @after_id::text)
 ORDER BY finished_at, id
 LIMIT @limit`

// reapedCountSQL counts the reaped jobs of the window after a cursor.
const reapedCountSQL = `
SELECT count(*)
  FROM {schema}.jobs
 WHERE status = 'FAILED' AND failure_reason IN ('stalled', 'lost_task', 'cancelled')
   AND finished_at > @now::timestamptz - @within::interval AND finished_at < 'infinity'
   AND (finished_at, id) > (@after_at::timestamptz, @after_id::text)`

func (p ReapedParams) args() pgx.NamedArgs {
	after := any(p.After.ReapedAt)
	if p.After.ReapedAt.IsZero() {
		after = "-infinity"
	}
	return pgx.NamedArgs{"now": p.Now, "within": pgcore.Interval(p.Within), "after_at": after, "after_id": p.After.ID, "limit": p.Limit}
}

// ListReaped returns one page of the jobs FAILED with a reason in
// MarkerReasons whose reap (finished_at) is less than p.Within before
// p.Now, in (finished_at, id) order after p.After, at most p.Limit; a page
// shorter than p.Limit is the last. It returns pgcore.ErrInvalidArgument for a
// Limit below 1, and a wrapped driver error when PostgreSQL fails.
func (s *Store) ListReaped(ctx context.Context, p ReapedParams) ([]Reaped, error) {
	if p.Limit < 1 {
		return nil, fmt.Errorf("jobs.ListReaped: %w: limit %d", pgcore.ErrInvalidArgument, p.Limit)
	}
	ctx, done := s.core.Op(ctx, "ListReaped")
	rows, err := s.core.DB().Query(ctx, s.core.Q(reapedSQL), p.args())
	if err != nil {
		return nil, done(err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Reaped, error) {
		var r Reaped
		return r, row.Scan(&r.JobID, &r.Generation, &r.ReapedAt, &r.MarkerConfirmed)
	})
	return out, done(err)
}

// CountReaped counts the jobs ListReaped would return from p.After on,
// ignoring p.Limit. It returns a wrapped driver error when PostgreSQL
// fails.
func (s *Store) CountReaped(ctx context.Context, p ReapedParams) (int, error) {
	ctx, done := s.core.Op(ctx, "CountReaped")
	var n int
	err := s.core.DB().QueryRow(ctx, s.core.Q(reapedCountSQL), p.args()).Scan(&n)
	return n, done(err)
}
