package pgstore

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/jobreaper/jobreaper/internal/pgcore"
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

// MarkerRef names the marker of one reap: the job and the generation it
// was reaped at.
type MarkerRef struct {
	JobID      string
	Generation int64
}

// markersLockedSQL is the first part of the markers statements: it locks
// the FAILED rows of refs (id and generation as recorded) in ID order, the
// order ReapBatch locks its batch in (reapLockSQL), before the UPDATE that
// follows changes any. Without it the UPDATE would lock rows in the order
// its scan returns them, the heap order when the planner picks a bitmap
// scan; a reap holding one row of the set and waiting for another would
// then close a cycle that PostgreSQL breaks by failing one of the two (and
// any start guard queued behind them on the row). LockRows runs above the
// sort, so the locks are taken in the sorted order. The rows are named by
// id = ANY(@ids), which only the primary key serves; the status is compared
// under COLLATE "C" so that the clause does not match the predicate of the
// partial index jobs_failed_finished_idx (see StallPredicate): on a table
// whose statistics say no row is FAILED the planner would otherwise read
// that whole index for each call.
const markersLockedSQL = `
WITH locked AS MATERIALIZED (
    SELECT j.id FROM {schema}.jobs j
      JOIN unnest(@ids::text[], @generations::int8[]) AS m(id, generation) ON m.id = j.id AND m.generation = j.generation
     WHERE j.id = ANY(@ids::text[]) AND j.status COLLATE "C" = 'FAILED'
     ORDER BY j.id
       FOR NO KEY UPDATE OF j
)`

// markersSetSQL records written markers on the rows markersLockedSQL
// locked.
const markersSetSQL = markersLockedSQL + `
UPDATE {schema}.jobs j SET marker_set_at = now()
  FROM locked l
 WHERE j.id = ANY(@ids::text[]) AND j.id = l.id AND j.marker_set_at IS NULL`

// MarkMarkerSet records that the marker of jobID's reap at generation was
// written, so ListMissingMarkers no longer returns the job. It changes
// nothing when the row has moved on (another generation, not FAILED).
// It returns a wrapped driver error when PostgreSQL fails.
func (s *Store) MarkMarkerSet(ctx context.Context, jobID string, generation int64) error {
	ctx, done := s.core.Op(ctx, "MarkMarkerSet")
	return done(s.markMarkersSet(ctx, []MarkerRef{{JobID: jobID, Generation: generation}}))
}

// MarkMarkersSet records, in one statement, that the markers of refs were
// written (see MarkMarkerSet); the reaper calls it once per batch of
// reaps. It returns a wrapped driver error when PostgreSQL fails.
func (s *Store) MarkMarkersSet(ctx context.Context, refs []MarkerRef) error {
	ctx, done := s.core.Op(ctx, "MarkMarkersSet")
	return done(s.markMarkersSet(ctx, refs))
}

func (s *Store) markMarkersSet(ctx context.Context, refs []MarkerRef) error {
	return s.markMarkers(ctx, s.core.Q(markersSetSQL), refs)
}

// markersFailedSQL clears marker_set_at of reaps whose marker write
// failed (ReapBatch sets it with the reap), on the rows markersLockedSQL
// locked.
const markersFailedSQL = markersLockedSQL + `
UPDATE {schema}.jobs j SET marker_set_at = NULL
  FROM locked l
 WHERE j.id = ANY(@ids::text[]) AND j.id = l.id AND j.marker_set_at IS NOT NULL`

// MarkMarkersFailed records, in one statement, that the markers of refs
// could not be written after their reap, which ReapBatch recorded as
// written: ListMissingMarkers then returns the jobs, and the next pass
// re-sets their markers. It changes nothing for a row that has moved on
// (another generation, not FAILED). It returns a wrapped driver error when
// PostgreSQL fails; the markers are then restored by the re-assertion of
// the markers of the last 7 days instead.
func (s *Store) MarkMarkersFailed(ctx context.Context, refs []MarkerRef) error {
	ctx, done := s.core.Op(ctx, "MarkMarkersFailed")
	return done(s.markMarkers(ctx, s.core.Q(markersFailedSQL), refs))
}

// markMarkers runs sql, a rendered markers statement, for refs.
func (s *Store) markMarkers(ctx context.Context, sql string, refs []MarkerRef) error {
	if len(refs) == 0 {
		return nil
	}
	ids, gens := make([]string, len(refs)), make([]int64, len(refs))
	for i, r := range refs {
		ids[i], gens[i] = r.JobID, r.Generation
	}
	return pgcore.PinnedExec(ctx, s.core.DB(), sql, pgx.NamedArgs{"ids": ids, "generations": gens})
}

// ListMissingMarkers returns reaped jobs (failure_reason stalled or
// lost_task) and cancelled jobs (cancelled) whose marker was never confirmed written and whose reap is
// less than within before now, oldest first, at most limit (0:
// MarkerRepairLimitDefault). now must be a reading of the database clock
// (the pass's), the clock finished_at was written by. It returns a wrapped
// driver error when PostgreSQL fails.
func (s *Store) ListMissingMarkers(ctx context.Context, now time.Time, within time.Duration, limit int) ([]MissingMarker, error) {
	ctx, done := s.core.Op(ctx, "ListMissingMarkers")
	if limit <= 0 {
		limit = MarkerRepairLimitDefault
	}
	rows, err := s.core.DB().Query(ctx, s.core.Q(`SELECT id, generation, finished_at FROM {schema}.jobs
 WHERE status = 'FAILED' AND marker_set_at IS NULL AND failure_reason IN ('stalled', 'lost_task', 'cancelled')
   AND finished_at > $1::timestamptz - $2::interval AND finished_at < 'infinity'
 ORDER BY finished_at, id
 LIMIT $3`), now, pgcore.Interval(within), limit)
	if err != nil {
		return nil, done(err)
	}
	missing, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (MissingMarker, error) {
		var m MissingMarker
		return m, row.Scan(&m.JobID, &m.Generation, &m.ReapedAt)
	})
	return missing, done(err)
}
