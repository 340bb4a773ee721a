package reaper

import (
	"context"
	"errors"
	"time"

	"github.com/jobreaper/jobreaper/internal/asynqstate"
	"github.com/jobreaper/jobreaper/internal/pgstore"
	"github.com/jobreaper/jobreaper/queue"
)

// repairMarkers re-sets the markers of jobs reaped within the marker's
// lifetime whose marker write was never confirmed (Redis failed at the
// reap). Each gets only what is left of its 7 days, counted from the reap
// to now, the pass's database clock reading taken just before (no second
// clock query); the marker's compare-and-set keeps a marker that is
// already there. The writes go in one pipeline and the written ones are
// recorded in one statement, so a repair after an outage costs two round
// trips whatever the number of markers (at most
// pgstore.MarkerRepairLimitDefault a pass), not two per marker.
//
// One bad key never stops the others: a key holding something jobreaper
// never writes (queue.ErrBadMarker) is an error of the pass naming the key,
// once per pass, and the loop goes on. A failure that is not about one key
// (Redis unreachable, the call's timeout) ends the repair for this pass;
// the markers not recorded are retried next pass. A failed read of the list
// of missing markers is a database error of the pass (stage load), not a
// marker write failure. A failed record of written markers is a warning:
// the next pass finds them missing and records them (their compare-and-set
// changes nothing).
//
// While hold holds the pass's marker writes (markerHold: no live asynq
// server serves a queue of the pass), nothing is written: the markers
// missing from Redis are counted in Result.MarkersHeld.
//
// It returns the jobs whose marker it tried, so that the pass's
// re-assertion (reassertMarkers) does not try them, or report a bad key,
// twice.
func (r *Reaper) repairMarkers(ctx context.Context, now time.Time, hold *markerHold, res *Result) (tried map[string]bool) {
	tried = map[string]bool{}
	if ctx.Err() != nil {
		return tried
	}
	missing, err := r.store.ListMissingMarkers(ctx, now, queue.MarkerTTL, 0)
	if err != nil {
		r.failed(ctx, res, stageLoad, "looking for missing markers failed; retried next pass", "err", err)
		return tried
	}
	if len(missing) == 0 {
		return tried
	}
	writes := make([]asynqstate.MarkerWrite, len(missing))
	for i, m := range missing {
		tried[m.JobID] = true
		writes[i] = asynqstate.MarkerWrite{JobID: m.JobID, Generation: m.Generation, TTL: asynqstate.MarkerRemaining(m.ReapedAt, now)}
	}
	if r.markersHeld(ctx, hold, res) {
		r.countHeld(ctx, writes, res)
		return tried
	}
	results := r.setMany(ctx, writes)
	var written []pgstore.MarkerRef
	defer func() { r.confirm(ctx, written) }()
	for i, out := range results {
		m := missing[i]
		if errors.Is(out.Err, queue.ErrBadMarker) {
			r.failed(ctx, res, stageMarker, "marker repair failed: the key holds a value jobreaper never writes; "+
				"delete the key and the next pass writes the marker (the FAILED row still refuses the task)",
				"key", queue.MarkerKey(m.JobID), "job_id", m.JobID, "generation", m.Generation, "err", out.Err)
			continue
		}
		if out.Err != nil {
			r.failed(ctx, res, stageMarker, "marker repair failed; Redis looks unavailable, the remaining markers are retried next pass",
				"key", queue.MarkerKey(m.JobID), "job_id", m.JobID, "remaining", len(missing)-i, "err", out.Err)
			return tried
		}
		written = append(written, pgstore.MarkerRef{JobID: m.JobID, Generation: m.Generation})
		if !out.Set {
			continue // already there, or its 7 days are over
		}
		r.opts.Metrics.markerRepaired(causeWriteFailed)
		res.MarkersRestored++
		r.log.Info("marker re-set after an earlier failed write", "job_id", m.JobID, "generation", m.Generation,
			"ttl", writes[i].TTL, "reaped_at", m.ReapedAt)
	}
	return tried
}
