package reaper

import (
	"context"
	"slices"
	"strings"
	"time"

	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/queue"
)

// SkipAwaitingRetry: a stalled PROCESSING job whose task is not active but
// waits in asynq's pending, scheduled, retry or aggregating set; asynq will
// run it again and the next claim takes the job over.
const SkipAwaitingRetry SkipReason = "awaiting_retry"

// SkipQueueNotFound: a stalled PROCESSING job whose task is not active and
// whose queue asynq does not know at all, so whether asynq will run the
// task cannot be told; the job is not reaped on a guess.
const SkipQueueNotFound SkipReason = "queue_not_found"

// reapLost finds lost tasks: PROCESSING jobs of the queues listed
// completely this pass that are stalled by the same rule, whose task is not
// among the active ones, and that asynq will never run again (archived,
// completed or gone, as when a worker is killed on its task's last attempt,
// or its handler is cancelled on the last attempt).
// Each is looked up in asynq, and those asynq will never run again are
// reaped with failure_reason lost_task by the same set-based
// compare-and-set as the active ones; jobs whose task still waits are skipped as
// awaiting_retry, jobs whose task became active meanwhile are left to the
// next pass. Rows without a queue are never considered.
func (r *Reaper) reapLost(ctx context.Context, listed, active []string, now time.Time, res *Result) {
	if len(listed) == 0 || ctx.Err() != nil {
		return
	}
	candidates, err := r.store.ListLostCandidates(ctx, jobs.LostCandidatesParams{
		Queues: listed, Active: active, Rule: r.opts.Rule,
	})
	if err != nil {
		r.failed(ctx, res, stageLoad, "looking for lost tasks failed; retried next pass", "err", err)
		return
	}
	var lost []jobs.Snapshot
	for _, snap := range candidates {
		if ctx.Err() != nil {
			return
		}
		// The SQL used the same rule; Decide states it once more on this
		// pass's clock reading, so a job is never reaped on one side alone.
		if v := Decide(&snap, now, r.opts.Rule); !v.Reap {
			if v.Skip == SkipBadRow { // the SQL cannot see it: count it here
				res.skip(v.Skip, 1)
				r.logSkip(snap.ID, &snap, v, false)
			}
			continue
		}
		status, err := r.lister.TaskStatus(ctx, snap.Queue, snap.ID)
		if err != nil {
			r.failed(ctx, res, stageList, "looking up a task failed; its job is left alone this pass", "job_id", snap.ID, "queue", snap.Queue, "err", err)
			continue
		}
		if status == queue.TaskActive {
			continue // started since the listing: the next pass judges it
		}
		if status == queue.TaskQueueNotFound {
			res.skip(SkipQueueNotFound, 1)
			r.log.Warn("stalled job's queue is unknown to asynq; not reaped on a guess (another Redis database? a name only the row uses?)",
				"job_id", snap.ID, "queue", snap.Queue)
			continue
		}
		if status.WillRun() {
			res.skip(SkipAwaitingRetry, 1)
			r.log.Debug("stalled job's task waits in asynq; left to its next attempt", "job_id", snap.ID, "task_status", status)
			continue
		}
		r.log.Info("stalled job's task will never run again", "job_id", snap.ID, "queue", snap.Queue, "task_status", status)
		lost = append(lost, snap)
	}
	slices.SortFunc(lost, func(a, b jobs.Snapshot) int { return strings.Compare(a.ID, b.ID) })
	r.reapSet(ctx, lost, jobs.ReasonLostTask, res)
}
