package reaper

import (
	"cmp"
	"context"
	"slices"

	"github.com/jobreaper/jobreaper/internal/asynqstate"
)

// MarkerProbe is a marker store that says which markers a write would
// change without writing any; *asynqstate.MarkerWriter is one. A pass whose
// marker writes are held counts with it the markers it would have written.
type MarkerProbe interface {
	MissingMany(ctx context.Context, writes []asynqstate.MarkerWrite) []asynqstate.MarkerResult
}

// markerHold decides, once per pass and only when a marker is to be
// written, whether marker repair and re-assertion are held: when no live
// asynq server serves any queue of the pass in the Redis the pass reads.
// A wrong Redis database or address (B46) looks exactly like that, and
// writing 7-day keys there would fill someone else's database; the
// lost-task search holds its reaps for the same reason (B29). The markers
// written right after a reap are never held: that reap happened because
// asynq showed the task active, or because a live server serves its queue.
type markerHold struct {
	queues []string
	live   *liveServers
	// decided: held was decided this pass.
	decided, held bool
}

// markersHeld reports whether this pass holds its marker writes, reading
// the live servers on the first call. A failed read holds them (an error
// of the pass, counted once).
func (r *Reaper) markersHeld(ctx context.Context, h *markerHold, res *Result) bool {
	if h.decided {
		return h.held
	}
	h.decided = true
	servers, ok := r.liveQueues(ctx, h.live, res, "marker repair and re-assertion are held this pass")
	h.held = !ok || !slices.ContainsFunc(h.queues, func(q string) bool { return servers[q] })
	return h.held
}

// countHeld counts, in Result.MarkersHeld, the writes a held pass would
// have made: those the store's probe finds missing, or all of them when
// the store has no probe. It returns false when the probe failed as a
// whole (Redis unreachable): an error of the pass, and the caller stops.
func (r *Reaper) countHeld(ctx context.Context, writes []asynqstate.MarkerWrite, res *Result) bool {
	probe, ok := r.markers.(MarkerProbe)
	if !ok {
		for _, w := range writes {
			if w.TTL.Milliseconds() > 0 {
				res.MarkersHeld++
			}
		}
		return true
	}
	for _, out := range probe.MissingMany(ctx, writes) {
		if out.Err != nil {
			r.failed(ctx, res, stageList, "reading markers to count the held ones failed; retried next pass", "err", out.Err)
			return false
		}
		if out.Set {
			res.MarkersHeld++
		}
	}
	return true
}

// warnMarkersHeld logs, once per pass, that the pass held its marker
// writes, naming the Redis (never its password) and how many markers were
// missing there.
func (r *Reaper) warnMarkersHeld(h *markerHold, res *Result) {
	if !h.decided || !h.held {
		return
	}
	msg := "marker writes held: no live asynq server serves any queue of this pass in the Redis it reads, " +
		"so no marker was re-asserted or repaired there. Likely causes: a wrong Redis database or address (--redis-url), " +
		"or no worker running yet. They are written once a live server serves a queue of the pass"
	if res.MarkersHeld == 0 {
		msg += "; none was missing"
	}
	r.log.Warn(msg, "redis", cmp.Or(r.opts.RedisName, "the Redis this daemon reads"), "markers_held", res.MarkersHeld,
		"queues", len(h.queues))
}
