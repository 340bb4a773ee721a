package reaper

import (
	"context"

	"github.com/jobreaper/jobreaper/internal/pgstore"
)

// Canceller publishes asynq's cancels of running handlers, in pipelines;
// *asynqstate.Canceller satisfies it.
type Canceller interface {
	Cancel(ctx context.Context, ids []string) (sent int, err error)
}

// cancelHandlers asks asynq to cancel the running handlers of a committed
// batch of reaps, after their markers: asynq then stops waiting for the
// handler at once, frees its worker slot and schedules a retry, which the
// start guard refuses (B30). A stalled job's task was listed active this
// pass; a lost job's handler may be running too (an active entry without a
// lease or task hash, whose handler hangs), and a cancel of a task that no
// worker runs is ignored by every worker, so every reap is cancelled. A
// handler that ignores its context keeps running until it returns; its
// late writes are refused and counted in
// jobreaper_late_results_refused_total. The reaps are committed, so the
// cancels are sent even when the pass is being stopped. A failed publish
// is logged, not an error of the pass: the reap stands, and the guard
// refuses the task's next delivery either way.
func (r *Reaper) cancelHandlers(ctx context.Context, reaped []pgstore.ReapedJob) {
	if r.opts.Canceller == nil || len(reaped) == 0 {
		return
	}
	ids := make([]string, len(reaped))
	for i, j := range reaped {
		ids[i] = j.JobID
	}
	sent, err := r.opts.Canceller.Cancel(context.WithoutCancel(ctx), ids)
	r.opts.Metrics.cancelsSent(sent)
	if err != nil {
		r.log.Warn("publishing asynq cancels of reaped jobs' handlers failed; their worker slots stay taken until the handlers return",
			"sent", sent, "of", len(ids), "first_job_id", ids[0], "err", err)
		return
	}
	r.log.Info("asked asynq to cancel the running handlers of reaped jobs", "cancels", sent, "first_job_id", ids[0])
}
