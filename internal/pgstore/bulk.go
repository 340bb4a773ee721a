package pgstore

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/jobreaper/jobreaper/internal/pgcore"
)

// BulkLimitMax is the most jobs one bulk requeue or cancel may select
// (its --limit): a filter that catches more is narrowed or run again.
const BulkLimitMax = 10000

// TimeBound is one end of a time filter: an instant, or a duration before
// the database's now(). The zero value is no bound.
type TimeBound struct {
	// At is the instant; zero when Ago is used.
	At time.Time
	// Ago is how long before the database's now(); used when At is zero
	// and Ago is positive.
	Ago time.Duration
}

// IsZero reports whether b bounds nothing.
func (b TimeBound) IsZero() bool { return b.At.IsZero() && b.Ago <= 0 }

// args returns the bound as the two SQL arguments boundSQL reads: the
// instant (nil when none) and the interval (nil when none).
func (b TimeBound) args() (any, any) {
	switch {
	case !b.At.IsZero():
		return b.At, nil
	case b.Ago > 0:
		return nil, pgcore.Interval(b.Ago)
	}
	return nil, nil
}

// JobFilter selects jobs for a bulk requeue or cancel. Empty lists match
// everything; a NULL queue counts as QueueDefault.
type JobFilter struct {
	// Types, Queues and Failures restrict the jobs to these types, queues
	// and failure reasons (Failures: requeue only).
	Types, Queues, Failures []string
	// FailedSince and FailedUntil bound finished_at (FAILED jobs:
	// since <= finished_at < until).
	FailedSince, FailedUntil TimeBound
	// CreatedSince bounds created_at (created_at >= since) and
	// StartedBefore the current attempt's started_at (started_at <
	// before; a job without one does not match).
	CreatedSince, StartedBefore TimeBound
	// Statuses are the statuses matched: FAILED for requeue, QUEUED and
	// PROCESSING for cancel.
	Statuses []string
	// Limit is the most IDs returned, 1 to BulkLimitMax.
	Limit int
}

// bulkSelectSQL selects the jobs of a JobFilter. Each time bound is an
// instant or an interval before now() (the database clock, the clock that
// wrote the timestamps), NULL when absent.
const bulkSelectSQL = `
WITH m AS (
SELECT id, coalesce(finished_at, created_at) AS at
  FROM {schema}.jobs
 WHERE status = ANY(@statuses::text[])
   AND (cardinality(@types::text[]) = 0 OR type = ANY(@types::text[]))
   AND (cardinality(@queues::text[]) = 0 OR coalesce(queue, @default_queue) = ANY(@queues::text[]))
   AND (cardinality(@failures::text[]) = 0 OR failure_reason = ANY(@failures::text[]))
   AND (@failed_since_at::timestamptz IS NULL OR finished_at >= @failed_since_at::timestamptz)
   AND (@failed_since_ago::interval IS NULL OR finished_at >= now() - @failed_since_ago::interval)
   AND (@failed_until_at::timestamptz IS NULL OR finished_at < @failed_until_at::timestamptz)
   AND (@failed_until_ago::interval IS NULL OR finished_at < now() - @failed_until_ago::interval)
   AND (@created_since_at::timestamptz IS NULL OR created_at >= @created_since_at::timestamptz)
   AND (@created_since_ago::interval IS NULL OR created_at >= now() - @created_since_ago::interval)
   AND (@started_before_at::timestamptz IS NULL OR started_at < @started_before_at::timestamptz)
   AND (@started_before_ago::interval IS NULL OR started_at < now() - @started_before_ago::interval)
)
SELECT (SELECT count(*) FROM m), coalesce((SELECT array_agg(id ORDER BY at, id) FROM (SELECT id, at FROM m ORDER BY at, id LIMIT @limit) l), '{}')`

// BulkSelection is what SelectJobs found.
type BulkSelection struct {
	// Matched is how many jobs match the filter, the limit aside.
	Matched int
	// IDs are the first Limit of them, oldest first (by finished_at for
	// FAILED jobs, created_at otherwise, then ID).
	IDs []string
}

// SelectJobs returns the jobs matching f, at most f.Limit, and how many
// match in all. It reads and changes nothing else: each job is then
// requeued or cancelled by its single-job path, which re-reads it.
//
// Errors: pgcore.ErrInvalidArgument for a Limit outside 1..BulkLimitMax,
// no status, or no time bound at all (a bulk form is always scoped);
// a wrapped driver error when PostgreSQL fails.
func (s *Store) SelectJobs(ctx context.Context, f JobFilter) (BulkSelection, error) {
	switch {
	case f.Limit < 1 || f.Limit > BulkLimitMax:
		return BulkSelection{}, fmt.Errorf("jobs.SelectJobs: %w: limit %d is not between 1 and %d", pgcore.ErrInvalidArgument, f.Limit, BulkLimitMax)
	case len(f.Statuses) == 0:
		return BulkSelection{}, fmt.Errorf("jobs.SelectJobs: %w: no status", pgcore.ErrInvalidArgument)
	case f.FailedSince.IsZero() && f.FailedUntil.IsZero() && f.CreatedSince.IsZero() && f.StartedBefore.IsZero():
		return BulkSelection{}, fmt.Errorf("jobs.SelectJobs: %w: no time bound", pgcore.ErrInvalidArgument)
	}
	ctx, done := s.core.Op(ctx, "SelectJobs")
	list := func(l []string) []string {
		if l == nil {
			return []string{}
		}
		return l
	}
	args := pgx.NamedArgs{"statuses": f.Statuses, "types": list(f.Types), "queues": list(f.Queues), "failures": list(f.Failures),
		"default_queue": QueueDefault, "limit": f.Limit}
	for name, b := range map[string]TimeBound{"failed_since": f.FailedSince, "failed_until": f.FailedUntil,
		"created_since": f.CreatedSince, "started_before": f.StartedBefore} {
		args[name+"_at"], args[name+"_ago"] = b.args()
	}
	var sel BulkSelection
	err := s.core.DB().QueryRow(ctx, s.core.Q(bulkSelectSQL), args).Scan(&sel.Matched, &sel.IDs)
	return sel, done(err)
}
