package reaper

import (
	"context"
	"sync"
	"time"

	"github.com/jobreaper/jobreaper/internal/asynqstate"
	"github.com/jobreaper/jobreaper/internal/pgstore"
)

// Defaults of the stale QUEUED report (Options.StaleQueuedAfter,
// Options.StaleQueuedLookups); the config package documents the why.
const (
	StaleQueuedAfterDefault   = time.Hour
	StaleQueuedLookupsDefault = 1000
)

// staleState carries the stale QUEUED report across passes: the keyset
// cursor over old QUEUED rows, and the counts per queue of the cycle so
// far, published to the gauge when the cycle ends.
type staleState struct {
	mu     sync.Mutex
	cursor pgstore.StaleCursor
	counts map[string]int
}

// reportStaleQueued finds QUEUED jobs older than StaleQueuedAfter whose
// task asynq will never run (archived before any middleware ran, completed,
// or never enqueued: not found), and reports them: Result.StaleQueued,
// a warning with the count and a few job IDs, and, once a cycle over the
// old QUEUED rows ends, the gauge jobreaper_stale_queued_jobs{queue}.
// Nothing changes them: `jobreaper requeue --stale` is the operator's.
//
// The rows are paged by the keyset (updated_at, id) through their partial
// index, at most StaleQueuedLookups looked up per daemon pass in pipelines
// (a normal backlog of pending tasks costs little), the cursor kept across
// passes; with Options.Once every row is looked up.
func (r *Reaper) reportStaleQueued(ctx context.Context, res *Result) {
	if ctx.Err() != nil {
		return
	}
	st := &r.stale
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.counts == nil {
		st.counts = map[string]int{}
	}
	state := r.asynqState()
	budget := r.opts.StaleQueuedLookups
	var sample []string
	defer func() {
		if res.StaleQueued > 0 {
			r.log.Warn("stale QUEUED jobs: asynq will never run their tasks (archived before any middleware ran, completed, "+
				"or never enqueued); nothing changes them: run jobreaper requeue --stale --reason ... or enqueue them again",
				"count", res.StaleQueued, "stale_queued_after", r.opts.StaleQueuedAfter, "job_ids", brokenSample(sample))
		}
	}()
	for ctx.Err() == nil {
		limit := asynqstate.StatusChunk
		if !r.opts.Once {
			limit = min(limit, budget)
		}
		page, err := r.store.ListStaleQueued(ctx, pgstore.StaleQueuedParams{
			Older: r.opts.StaleQueuedAfter, Queues: r.opts.Queues, After: st.cursor, Limit: limit,
		})
		if err != nil {
			r.failed(ctx, res, stageLoad, "reading old QUEUED jobs failed; retried next pass", "err", err)
			return
		}
		refs := make([]asynqstate.TaskRef, len(page))
		for i, row := range page {
			refs[i] = asynqstate.TaskRef{Queue: row.Queue, ID: row.ID}
		}
		statuses, err := state.TaskStatuses(ctx, refs)
		if err != nil {
			r.failed(ctx, res, stageList, "looking up the tasks of old QUEUED jobs failed; retried next pass", "jobs", len(refs), "err", err)
			return
		}
		for i, row := range page {
			if s := statuses[i]; s.WillRun() && s != asynqstate.TaskQueueNotFound {
				continue
			}
			st.counts[labelValue(row.Queue)]++
			res.StaleQueued++
			if len(sample) < brokenSampleMax {
				sample = append(sample, row.ID)
			}
		}
		if len(page) < limit {
			// The end of the old QUEUED rows: publish the cycle's counts.
			r.opts.Metrics.staleQueuedCounts(st.counts)
			st.cursor, st.counts = pgstore.StaleCursor{}, nil
			return
		}
		last := page[len(page)-1]
		st.cursor = pgstore.StaleCursor{UpdatedAt: last.UpdatedAt, ID: last.ID}
		if !r.opts.Once {
			if budget -= len(page); budget <= 0 {
				return
			}
		}
	}
}
