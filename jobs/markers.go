package jobs

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
)

// MarkerRepairLimitDefault bounds how many markers one ListMissingMarkers
// call returns, so that a pass after a long Redis outage catches up over
// several passes.
const MarkerRepairLimitDefault = 500

// MissingMarker is a reaped job whose Redis marker was never confirmed
// written.
type MissingMarker struct {
	JobID      string
	Generation int64
	// ReapedAt is the reap's time on the database clock (finished_at); the
	// marker's lifetime runs from it.
	ReapedAt time.Time
}

// MarkMarkerSet records that the marker of jobID's reap at generation was
// written, so ListMissingMarkers no longer returns the job. It changes
// nothing when the row has moved on (another generation, not FAILED).
// It returns a wrapped driver error when PostgreSQL fails.
func (s *Store) MarkMarkerSet(ctx context.Context, jobID string, generation int64) error {
	ctx, done := s.op(ctx, "MarkMarkerSet")
	_, err := s.db.Exec(ctx, s.q(`UPDATE {schema}.jobs SET marker_set_at = now()
 WHERE id = $1 AND generation = $2 AND status = 'FAILED' AND marker_set_at IS NULL`), jobID, generation)
	return done(err)
}

// ListMissingMarkers returns reaped jobs (failure_reason stalled or
// lost_task) whose marker was never confirmed written and whose reap is
// less than within before now, oldest first, at most limit (0:
// MarkerRepairLimitDefault). now must be a reading of the database clock
// (the pass's), the clock finished_at was written by. It returns a wrapped
// driver error when PostgreSQL fails.
func (s *Store) ListMissingMarkers(ctx context.Context, now time.Time, within time.Duration, limit int) ([]MissingMarker, error) {
	ctx, done := s.op(ctx, "ListMissingMarkers")
	if limit <= 0 {
		limit = MarkerRepairLimitDefault
	}
	rows, err := s.db.Query(ctx, s.q(`SELECT id, generation, finished_at FROM {schema}.jobs
 WHERE status = 'FAILED' AND marker_set_at IS NULL AND failure_reason IN ('stalled', 'lost_task')
   AND finished_at > $1::timestamptz - $2::interval
 ORDER BY finished_at, id
 LIMIT $3`), now, Interval(within), limit)
	if err != nil {
		return nil, done(err)
	}
	missing, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (MissingMarker, error) {
		var m MissingMarker
		return m, row.Scan(&m.JobID, &m.Generation, &m.ReapedAt)
	})
	return missing, done(err)
}
