package pgstore

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/jobreaper/jobreaper/internal/pgcore"
)

// Percentiles are seconds; nil where the window holds no value.
type Percentiles struct {
	P50, P95, P99, Max *float64
}

// TypeWindowStats is what a job type's events of a window measured, and
// its limits as the daemon applies them: what suggest-limits works from.
type TypeWindowStats struct {
	Type string
	// MaxRuntime, StallTimeout and HardTimeout are the type's limits; a
	// NULL stall timeout is the daemon's default, a NULL hard timeout
	// the default hard timeout (WindowStatsParams).
	MaxRuntime, StallTimeout, HardTimeout time.Duration
	// Attempts counts the finished attempts of the window: completed and
	// failed events (handler failures; a reap writes a reaped event, never
	// a failed one) whose detail carries runtime_seconds.
	Attempts int
	// Runtime holds the percentiles of their runtime_seconds; Gap those of
	// their max_idle_gap_seconds and of the idle time of each job reaped
	// while alive (whose longest gap was at least that), P95 left nil.
	Runtime, Gap Percentiles
	// Reaps counts the reaped events of the window; ReapedWhileAlive
	// those followed by a late_result_rejected event of a Complete or an
	// Advance of the reaped generation: a worker that was still running.
	Reaps, ReapedWhileAlive int
	// ReapDelay holds P50 and Max of how long each reaped job had been
	// reapable when it was reaped, seconds: min(idle - stall timeout,
	// runtime - max_runtime) of its evidence.
	ReapDelay Percentiles
}

// WindowStatsParams select the window and type of WindowStats.
type WindowStatsParams struct {
	// Window is how far back from the database's now() events count;
	// positive.
	Window time.Duration
	// Type, when not empty, limits the answer to that job type.
	Type string
	// DefaultStallTimeout and DefaultHardTimeout stand for NULL columns.
	DefaultStallTimeout, DefaultHardTimeout time.Duration
}

// windowStatsSQL measures each job type's events of the window in one
// statement. Every read of job_events by kind and time goes through
// job_events_kind_at_idx; the late_result_rejected event of a reaped job
// is looked up by job_events_job_idx (job_id, id). A detail field that is
// not a JSON number (an event written before the field existed) counts as
// no value. Percentiles are percentile_cont, interpolated.
const windowStatsSQL = `
WITH fin AS (
  SELECT j.type,
         CASE WHEN jsonb_typeof(e.detail->'runtime_seconds') = 'number' THEN (e.detail->>'runtime_seconds')::float8 END AS runtime,
         CASE WHEN jsonb_typeof(e.detail->'max_idle_gap_seconds') = 'number' THEN (e.detail->>'max_idle_gap_seconds')::float8 END AS gap
    FROM {schema}.job_events e
    JOIN {schema}.jobs j ON j.id = e.job_id
   WHERE e.kind IN ('completed', 'failed') AND e.at >= now() - @window::interval
     AND (@type = '' OR j.type = @type)
), reaps AS (
  SELECT j.type,
         CASE WHEN jsonb_typeof(r.detail->'idle_seconds') = 'number' THEN (r.detail->>'idle_seconds')::float8 END AS idle,
         CASE WHEN jsonb_typeof(r.detail->'max_idle_gap_seconds') = 'number' THEN (r.detail->>'max_idle_gap_seconds')::float8 END AS gap,
         CASE WHEN jsonb_typeof(r.detail->'idle_seconds') = 'number' AND jsonb_typeof(r.detail->'stall_timeout_seconds') = 'number'
               AND jsonb_typeof(r.detail->'runtime_seconds') = 'number' AND jsonb_typeof(r.detail->'max_runtime_seconds') = 'number'
              THEN least((r.detail->>'idle_seconds')::float8 - (r.detail->>'stall_timeout_seconds')::float8,
                         (r.detail->>'runtime_seconds')::float8 - (r.detail->>'max_runtime_seconds')::float8) END AS delay,
         EXISTS (SELECT 1 FROM {schema}.job_events l
                  WHERE l.job_id = r.job_id AND l.id > r.id AND l.kind = 'late_result_rejected'
                    AND l.detail->>'operation' IN ('Complete', 'Advance')
                    AND l.detail->>'stale_generation' = r.generation::text) AS alive
    FROM {schema}.job_events r
    JOIN {schema}.jobs j ON j.id = r.job_id
   WHERE r.kind = 'reaped' AND r.at >= now() - @window::interval
     AND (@type = '' OR j.type = @type)
), gaps AS (
  SELECT type, gap FROM fin WHERE runtime IS NOT NULL AND gap IS NOT NULL
  UNION ALL
  SELECT type, greatest(idle, gap) FROM reaps WHERE alive AND greatest(idle, gap) IS NOT NULL
), f AS (
  SELECT type, count(*) AS n,
         percentile_cont(0.5) WITHIN GROUP (ORDER BY runtime) AS p50,
         percentile_cont(0.95) WITHIN GROUP (ORDER BY runtime) AS p95,
         percentile_cont(0.99) WITHIN GROUP (ORDER BY runtime) AS p99,
         max(runtime) AS mx
    FROM fin WHERE runtime IS NOT NULL GROUP BY type
), g AS (
  SELECT type,
         percentile_cont(0.5) WITHIN GROUP (ORDER BY gap) AS p50,
         percentile_cont(0.99) WITHIN GROUP (ORDER BY gap) AS p99,
         max(gap) AS mx
    FROM gaps GROUP BY type
), r AS (
  SELECT type, count(*) AS n, count(*) FILTER (WHERE alive) AS alive,
         percentile_cont(0.5) WITHIN GROUP (ORDER BY delay) AS p50, max(delay) AS mx
    FROM reaps GROUP BY type
)
SELECT t.name,
       extract(epoch FROM t.max_runtime)::float8,
       extract(epoch FROM coalesce(t.stall_timeout, @default_stall::interval))::float8,
       extract(epoch FROM coalesce(t.hard_timeout, @default_hard::interval))::float8,
       coalesce(f.n, 0), f.p50, f.p95, f.p99, f.mx,
       g.p50, g.p99, g.mx,
       coalesce(r.n, 0), coalesce(r.alive, 0), r.p50, r.mx
  FROM {schema}.job_types t
  LEFT JOIN f ON f.type = t.name
  LEFT JOIN g ON g.type = t.name
  LEFT JOIN r ON r.type = t.name
 WHERE @type = '' OR t.name = @type
 ORDER BY t.name`

// WindowStats measures, in one read-only statement, every job type's (or
// p.Type's) finished attempts and reaps of the last p.Window on the
// database clock. A type of job_types with no event in the window is
// listed with zero counts; events of types job_types does not hold are
// not. Errors: pgcore.ErrInvalidArgument for a window not positive; a
// wrapped driver error, or the operation's timeout, when PostgreSQL fails.
func (s *Store) WindowStats(ctx context.Context, p WindowStatsParams) ([]TypeWindowStats, error) {
	if p.Window <= 0 {
		return nil, fmt.Errorf("jobs.WindowStats: %w: the window must be positive, not %s", pgcore.ErrInvalidArgument, p.Window)
	}
	ctx, done := s.core.Op(ctx, "WindowStats")
	rows, err := s.core.DB().Query(ctx, s.core.Q(windowStatsSQL), pgx.NamedArgs{
		"window": pgcore.Interval(p.Window), "type": p.Type,
		"default_stall": pgcore.Interval(p.DefaultStallTimeout), "default_hard": pgcore.Interval(p.DefaultHardTimeout),
	})
	if err != nil {
		return nil, done(err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (TypeWindowStats, error) {
		var (
			st                 TypeWindowStats
			maxRT, stall, hard float64
		)
		err := row.Scan(&st.Type, &maxRT, &stall, &hard,
			&st.Attempts, &st.Runtime.P50, &st.Runtime.P95, &st.Runtime.P99, &st.Runtime.Max,
			&st.Gap.P50, &st.Gap.P99, &st.Gap.Max,
			&st.Reaps, &st.ReapedWhileAlive, &st.ReapDelay.P50, &st.ReapDelay.Max)
		st.MaxRuntime, st.StallTimeout, st.HardTimeout = secondsDuration(maxRT), secondsDuration(stall), secondsDuration(hard)
		return st, err
	})
	return out, done(err)
}

// secondsDuration turns seconds into a Duration, to the microsecond
// PostgreSQL keeps.
func secondsDuration(s float64) time.Duration {
	return time.Duration(s*1e6) * time.Microsecond
}
