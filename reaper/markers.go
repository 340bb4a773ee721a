package reaper

import (
	"context"
	"errors"
	"time"

	"github.com/jobreaper/jobreaper/queue"
)

// markerWritten records in the job row that its marker is in Redis. If
// that fails, a later pass finds the marker "missing", re-sets it (a no-op:
// the compare-and-set keeps the existing one) and records it then.
func (r *Reaper) markerWritten(ctx context.Context, jobID string, generation int64) {
	if err := r.store.MarkMarkerSet(ctx, jobID, generation); err != nil {
		r.log.Warn("could not record the marker write; a later pass records it", "job_id", jobID, "err", err)
	}
}

// repairMarkers re-sets the markers of jobs reaped within the marker's
// lifetime whose marker write was never confirmed (Redis failed at the
// reap). Each gets only what is left of its 7 days, counted from the reap
// to now, the pass's database clock reading taken just before (no second
// clock query); the marker's compare-and-set keeps a marker that is
// already there.
//
// One bad key never stops the others: a key holding something jobreaper
// never writes (queue.ErrBadMarker) is an error of the pass naming the key,
// once per pass, and the loop goes on. A failure that is not about one key
// (Redis unreachable, the call's timeout) ends the repair for this pass,
// since every later write would wait for the same timeout; the rest are
// retried next pass. A failed read of the list of missing markers is a
// database error of the pass (stage load), not a marker write failure.
//
// It returns the jobs whose marker it tried, so that the pass's
// re-assertion (reassertMarkers) does not try them, or report a bad key,
// twice.
func (r *Reaper) repairMarkers(ctx context.Context, now time.Time, res *Result) (tried map[string]bool) {
	tried = map[string]bool{}
	if ctx.Err() != nil {
		return tried
	}
	missing, err := r.store.ListMissingMarkers(ctx, now, queue.MarkerTTL, 0)
	if err != nil {
		r.failed(ctx, res, stageLoad, "looking for missing markers failed; retried next pass", "err", err)
		return tried
	}
	for i, m := range missing {
		if ctx.Err() != nil {
			return tried
		}
		tried[m.JobID] = true
		ttl := queue.MarkerRemaining(m.ReapedAt, now)
		set, err := r.markers.Set(ctx, m.JobID, m.Generation, ttl)
		if errors.Is(err, queue.ErrBadMarker) {
			r.failed(ctx, res, stageMarker, "marker repair failed: the key holds a value jobreaper never writes; "+
				"delete the key and the next pass writes the marker (the FAILED row still refuses the task)",
				"key", queue.MarkerKey(m.JobID), "job_id", m.JobID, "generation", m.Generation, "err", err)
			continue
		}
		if err != nil {
			r.failed(ctx, res, stageMarker, "marker repair failed; Redis looks unavailable, the remaining markers are retried next pass",
				"key", queue.MarkerKey(m.JobID), "job_id", m.JobID, "remaining", len(missing)-i, "err", err)
			return tried
		}
		r.markerWritten(ctx, m.JobID, m.Generation)
		if !set {
			continue // already there, or its 7 days are over
		}
		r.opts.Metrics.markerRepaired(causeWriteFailed)
		res.MarkersRestored++
		r.log.Info("marker re-set after an earlier failed write", "job_id", m.JobID, "generation", m.Generation,
			"ttl", ttl, "reaped_at", m.ReapedAt)
	}
	return tried
}
