package reaper

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/jobreaper/jobreaper/internal/asynqstate"
	"github.com/jobreaper/jobreaper/internal/pgstore"
	"github.com/jobreaper/jobreaper/queue"
)

// MarkerCheckWindowDefault is the time within which the daemon re-asserts
// every marker of the last 7 days (Options.MarkerCheckWindow).
const MarkerCheckWindowDefault = time.Hour

// ReassertMarkers is a marker store that re-asserts many markers by
// reading them first and writing only those not there;
// *asynqstate.MarkerWriter is one. Its answers are SetMany's.
type ReassertMarkers interface {
	ReassertMany(ctx context.Context, writes []asynqstate.MarkerWrite) []asynqstate.MarkerResult
}

// reassertPage is how many reaped jobs one statement reads and one marker
// pipeline re-asserts (asynq's Inspector pages by the same number).
const reassertPage = 1000

// reassertState is where the re-assertion cycle stands between passes:
// the last job re-asserted, and when the cycle began (database clock).
type reassertState struct {
	mu         sync.Mutex
	cursor     pgstore.ReapedCursor
	cycleStart time.Time
	// passes counts the passes of the cycle so far.
	passes int
}

// reassertMarkers re-asserts the marker of every job reaped within the
// marker's 7 days, by running the marker's own compare-and-set again in
// pipelines of reassertPage (with ReassertMarkers, only for the keys a
// pipeline of GETs did not find holding this generation or a newer one): a marker that is there (this generation or a
// newer one) is left as it is, so a TTL is never extended and a newer
// generation never overwritten; a missing one (written once and then lost
// to a failover, an eviction or a delete, or never written) is set with
// what is left of its 7 days on the database clock. A plain EXISTS would
// not do: it would take an older generation's marker for this one.
//
// The jobs are visited by the keyset (finished_at, id), a slice per pass,
// sized so that the whole window is covered within MarkerCheckWindow
// whatever the number of reaps: the rows left in the cycle divided by the
// passes left in it. With Options.Once every job is visited in this pass.
// Each restored marker counts in Result.MarkersRestored and in
// jobreaper_markers_repaired_total{cause} (lost, or write_failed for a
// marker never confirmed written, whose row is then marked written). A key
// holding something jobreaper never writes is an error naming it and the
// rest go on; a Redis-wide failure ends the slice, retried next pass.
//
// Jobs in tried (repairMarkers tried them this pass) are passed over.
// While hold holds the pass's marker writes, the slice is read the same
// way but nothing is written: the missing markers are counted in
// Result.MarkersHeld, and the next cycle looks at them again.
func (r *Reaper) reassertMarkers(ctx context.Context, now time.Time, tried map[string]bool, hold *markerHold, res *Result) {
	if ctx.Err() != nil {
		return
	}
	st := &r.reassert
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.cycleStart.IsZero() {
		st.cycleStart = now
	}
	params := pgstore.ReapedParams{Now: now, Within: queue.MarkerTTL, After: st.cursor}
	budget := -1 // every job: run --once
	if !r.opts.Once {
		remaining, err := r.store.CountReaped(ctx, params)
		if err != nil {
			r.failed(ctx, res, stageLoad, "counting reaped jobs for marker re-assertion failed; retried next pass", "err", err)
			return
		}
		// The passes left in the cycle: by the clock, and by count (the
		// cycle has MarkerCheckWindow / Interval passes), whichever is fewer.
		byCount := int(r.opts.MarkerCheckWindow/r.opts.Interval) - st.passes
		byClock := int(st.cycleStart.Add(r.opts.MarkerCheckWindow).Sub(now) / r.opts.Interval)
		budget = sliceOf(remaining, min(byCount, byClock))
		st.passes++
		if budget == 0 {
			// Nothing after the cursor: the next pass starts a new cycle.
			st.cursor, st.cycleStart, st.passes = pgstore.ReapedCursor{}, time.Time{}, 0
			return
		}
	}
	for budget != 0 && ctx.Err() == nil {
		params.Limit = reassertPage
		if budget > 0 {
			params.Limit = min(reassertPage, budget)
		}
		page, err := r.store.ListReaped(ctx, params)
		if err != nil {
			r.failed(ctx, res, stageLoad, "reading reaped jobs for marker re-assertion failed; retried next pass", "err", err)
			return
		}
		done, ok := r.reassertPage(ctx, page, now, tried, hold, res)
		if done > 0 {
			last := page[done-1]
			st.cursor = pgstore.ReapedCursor{ReapedAt: last.ReapedAt, ID: last.JobID}
			params.After = st.cursor
		}
		if !ok {
			return
		}
		if len(page) < params.Limit {
			// The end of the window: the next pass starts a new cycle.
			st.cursor, st.cycleStart, st.passes = pgstore.ReapedCursor{}, time.Time{}, 0
			return
		}
		if budget > 0 {
			budget -= len(page)
		}
	}
}

// sliceOf returns how many of remaining rows this pass must visit so that
// all are visited within passes passes, this one included: remaining
// divided by passes, rounded up; all of them when this is the last. It is
// at least 1 while rows remain.
func sliceOf(remaining, passes int) int {
	if remaining <= 0 {
		return 0
	}
	if passes <= 1 {
		return remaining
	}
	return (remaining + passes - 1) / passes
}

// reassertPage runs the compare-and-set for one page of reaped jobs in one
// pipeline, or, while hold holds the writes, counts the missing markers.
// It returns how many jobs of the page were dealt with (all of them
// unless Redis failed as a whole) and false when the slice must end.
func (r *Reaper) reassertPage(ctx context.Context, page []pgstore.Reaped, now time.Time, tried map[string]bool, hold *markerHold, res *Result) (int, bool) {
	writes := make([]asynqstate.MarkerWrite, len(page))
	for i, j := range page {
		writes[i] = asynqstate.MarkerWrite{JobID: j.JobID, Generation: j.Generation, TTL: asynqstate.MarkerRemaining(j.ReapedAt, now)}
		if tried[j.JobID] {
			writes[i].TTL = 0 // SetMany sends nothing for it
		}
	}
	if len(page) > 0 && r.markersHeld(ctx, hold, res) {
		if !r.countHeld(ctx, writes, res) {
			return 0, false
		}
		return len(page), true
	}
	var results []asynqstate.MarkerResult
	if rm, ok := r.markers.(ReassertMarkers); ok {
		results = rm.ReassertMany(ctx, writes)
	} else {
		results = r.setMany(ctx, writes)
	}
	var confirm []pgstore.MarkerRef
	for i, out := range results {
		j := page[i]
		if tried[j.JobID] {
			continue
		}
		switch {
		case errors.Is(out.Err, queue.ErrBadMarker):
			r.failed(ctx, res, stageMarker, "marker re-assertion failed: the key holds a value jobreaper never writes; "+
				"delete the key and the next cycle writes the marker (the FAILED row still refuses the task)",
				"key", queue.MarkerKey(j.JobID), "job_id", j.JobID, "generation", j.Generation, "err", out.Err)
			continue
		case out.Err != nil:
			r.failed(ctx, res, stageMarker, "marker re-assertion failed; Redis looks unavailable, the rest are re-asserted next pass",
				"key", queue.MarkerKey(j.JobID), "job_id", j.JobID, "remaining", len(page)-i, "err", out.Err)
			r.confirm(ctx, confirm)
			return i, false
		}
		if !j.MarkerConfirmed {
			confirm = append(confirm, pgstore.MarkerRef{JobID: j.JobID, Generation: j.Generation})
		}
		if !out.Set {
			continue // there (this generation or newer), or its 7 days are over
		}
		cause := causeLost
		if !j.MarkerConfirmed {
			cause = causeWriteFailed
		}
		res.MarkersRestored++
		r.opts.Metrics.markerRepaired(cause)
		r.log.Info("marker restored", "job_id", j.JobID, "generation", j.Generation, "cause", cause,
			"ttl", writes[i].TTL, "reaped_at", j.ReapedAt)
	}
	r.confirm(ctx, confirm)
	return len(page), true
}

// confirm records written markers in their rows, in one statement.
func (r *Reaper) confirm(ctx context.Context, refs []pgstore.MarkerRef) {
	if len(refs) == 0 {
		return
	}
	if err := r.store.MarkMarkersSet(ctx, refs); err != nil {
		r.log.Warn("could not record marker writes; a later pass records them", "markers", len(refs), "err", err)
	}
}

// setMany writes markers in one pipeline when the store can, one Set each
// otherwise. Without a pipeline, the first failure that is not about its
// key (Redis unreachable, the call's timeout) is the answer of every write
// after it too, which are not sent: each would wait for the same timeout.
func (r *Reaper) setMany(ctx context.Context, writes []asynqstate.MarkerWrite) []asynqstate.MarkerResult {
	if bm, ok := r.markers.(BatchMarkers); ok {
		return bm.SetMany(ctx, writes)
	}
	out := make([]asynqstate.MarkerResult, len(writes))
	for i, w := range writes {
		out[i].Set, out[i].Err = r.markers.Set(ctx, w.JobID, w.Generation, w.TTL)
		if out[i].Err != nil && !errors.Is(out[i].Err, queue.ErrBadMarker) {
			for j := i + 1; j < len(out); j++ {
				out[j].Err = out[i].Err
			}
			break
		}
	}
	return out
}
