package reaper

import (
	"context"
	"errors"
	"time"

	"github.com/jobreaper/jobreaper/internal/asynqstate"
	"github.com/jobreaper/jobreaper/internal/pgcore"
	"github.com/jobreaper/jobreaper/internal/pgstore"
	"github.com/jobreaper/jobreaper/jobs"
)

// RetryPlan is what a reap does with a stalled or lost job: fail it, or
// run it again within its type's retry budget (job_types.reap_retries).
type RetryPlan uint8

const (
	// PlanFail: the budget is spent (or the type has none): the job is
	// failed, its cascade run and its marker written.
	PlanFail RetryPlan = iota
	// PlanRetry: a retry reap; the row goes back to QUEUED with its
	// generation and reap_count raised.
	PlanRetry
	// PlanRetryImpossible: budget left, but asynq holds no task to run
	// again (no payload to send): failed as PlanFail, with
	// reap_retry_impossible in its event.
	PlanRetryImpossible
)

// DecideRetry decides, with no I/O and before the reap's compare-and-set,
// whether a reap of a job with budget b for reason is a retry: a stalled
// job (its task active) with reap_count below reap_retries is retried; a
// lost job with budget left is retried when asynq holds its task archived
// or completed (task), whose payload a new task can carry, and otherwise
// failed as PlanRetryImpossible; a job whose budget is spent is failed.
func DecideRetry(b pgcore.ReapBudget, reason string, task asynqstate.TaskStatus) RetryPlan {
	if b.Count >= b.Retries {
		return PlanFail
	}
	switch reason {
	case jobs.ReasonStalled:
		return PlanRetry
	case jobs.ReasonLostTask:
		if task == asynqstate.TaskArchived || task == asynqstate.TaskCompleted {
			return PlanRetry
		}
		return PlanRetryImpossible
	}
	return PlanFail
}

// RetryDelay is when a lost job's replaced task runs after its count-th
// retry reap of the life (count >= 1): delay x 2^(count - 1), saturated at
// jobs.MaxDuration.
func RetryDelay(delay time.Duration, count int) time.Duration {
	if delay <= 0 {
		return 0
	}
	for i := 1; i < count; i++ {
		if delay > jobs.MaxDuration/2 {
			return jobs.MaxDuration
		}
		delay *= 2
	}
	return delay
}

// TaskReplacer replaces a retry-reaped job's archived or completed task by
// a new one of the same ID, type and payload delivered in processIn;
// *asynqstate.RetryReplacer satisfies it. Its errors wrap
// asynqstate.ErrTaskGone when asynq holds no task.
type TaskReplacer interface {
	Replace(ctx context.Context, jobID, queue, typ string, processIn time.Duration) error
}

// RetryStore is what finishing retry reaps needs from PostgreSQL;
// *pgstore.Store satisfies it.
type RetryStore interface {
	ListRetryPending(ctx context.Context, p pgstore.RetryPendingParams) ([]pgstore.RetryPending, error)
	FailRetryImpossible(ctx context.Context, pending []pgstore.RetryPending) ([]pgstore.ReapedJob, error)
}

// Actions of the later passes on retry-reaped jobs, the keys of
// Result.RetriesFinished and the action label of
// jobreaper_reap_retries_finished_total.
const (
	// RetryReenqueued: asynq archived or completed the task (its cancelled
	// delivery was its last): replaced as the retry reap of a lost job does.
	RetryReenqueued = "reenqueued"
	// RetryCancelResent: the task was still active a pass later (the
	// cancel, an at-most-once publish, was lost): cancelled again.
	RetryCancelResent = "cancel_resent"
	// RetryFailedImpossible: asynq held no task (a crash between the delete
	// and the enqueue): failed with reap_retry_impossible.
	RetryFailedImpossible = "failed_impossible"
)

// afterRetries makes the committed retry reaps of one batch run again:
// a stalled job's running handler is cancelled (whatever cancel on reap
// says: the retry needs the worker slot), and asynq's own retry delivers
// it; a lost job's archived or completed task is replaced, delivered in
// RetryDelay. The reaps are committed, so this runs even when the pass is
// being stopped. A failure is an error of the pass; a later pass finishes
// what is left (finishRetries).
func (r *Reaper) afterRetries(ctx context.Context, retried []pgstore.ReapedJob, reason string, queues map[string]string, res *Result) {
	if len(retried) == 0 {
		return
	}
	actx := context.WithoutCancel(ctx)
	if reason == jobs.ReasonStalled {
		r.cancelRetries(actx, retried)
		return
	}
	for _, j := range retried {
		r.replaceTask(actx, j.JobID, queues[j.JobID], j.Type, RetryDelay(j.RetryDelay, j.Evidence.ReapCount), res)
	}
}

// cancelRetries publishes the cancels of retry-reaped stalled jobs.
func (r *Reaper) cancelRetries(ctx context.Context, retried []pgstore.ReapedJob) {
	c := r.retryCanceller()
	if c == nil {
		r.log.Warn("no asynq canceller configured: retry-reaped jobs' handlers are not cancelled; a later pass finishes them", "jobs", len(retried))
		return
	}
	ids := make([]string, len(retried))
	for i, j := range retried {
		ids[i] = j.JobID
	}
	sent, err := c.Cancel(ctx, ids)
	r.opts.Metrics.cancelsSent(sent)
	if err != nil {
		r.log.Warn("publishing asynq cancels of retry-reaped jobs failed; a later pass sends them again",
			"sent", sent, "of", len(ids), "first_job_id", ids[0], "err", err)
	}
}

func (r *Reaper) retryCanceller() Canceller {
	if r.opts.RetryCanceller != nil {
		return r.opts.RetryCanceller
	}
	return r.opts.Canceller
}

// replaceTask replaces one retry-reaped job's task; it reports whether it
// did, and whether asynq held no task at all.
func (r *Reaper) replaceTask(ctx context.Context, id, queue, typ string, delay time.Duration, res *Result) (replaced, gone bool) {
	if r.opts.Replacer == nil {
		r.failed(ctx, res, stageReap, "no task replacer configured: a retry-reaped lost job's task cannot be replaced", "job_id", id)
		return false, false
	}
	err := r.opts.Replacer.Replace(ctx, id, cmpQueue(queue), typ, delay)
	switch {
	case err == nil:
		r.log.Info("retry-reaped job's task replaced", "job_id", id, "queue", queue, "process_in", delay)
		return true, false
	case errors.Is(err, asynqstate.ErrTaskGone):
		return false, true
	case errors.Is(err, asynqstate.ErrReplaceRefused):
		r.log.Info("retry-reaped job's task not replaced", "job_id", id, "err", err)
		return false, false
	}
	r.failed(ctx, res, stageReap, "replacing a retry-reaped job's task failed; a later pass finishes it", "job_id", id, "err", err)
	return false, false
}

func cmpQueue(q string) string {
	if q == "" {
		return pgstore.QueueDefault
	}
	return q
}

// retryState carries the retry-finishing cursor across passes.
type retryState struct {
	after string
}

// finishRetries finishes what retry reaps started, because asynq can
// strand them: among the QUEUED rows retry-reaped at least one interval
// ago in the listed queues (a page per pass, the cursor kept across
// passes), a task asynq holds archived or completed is replaced; one still
// active gets its cancel again; a job whose task asynq does not hold at all
// is failed with reap_retry_impossible in a second, fenced transaction,
// and its marker written, while a live server serves its queue (else it
// is left, as a lost task would be held). A task that waits is left to its
// delivery, which the start guard claims.
func (r *Reaper) finishRetries(ctx context.Context, listed []string, live *liveServers, res *Result) {
	rs, ok := r.store.(RetryStore)
	if !ok || r.opts.DryRun || len(listed) == 0 || ctx.Err() != nil {
		return
	}
	pending, err := rs.ListRetryPending(ctx, pgstore.RetryPendingParams{
		Queues: listed, Settle: r.opts.Interval, After: r.retry.after, Limit: pgstore.RetryPendingLimitDefault,
	})
	if err != nil {
		r.failed(ctx, res, stageLoad, "reading retry-reaped jobs failed; retried next pass", "err", err)
		return
	}
	if len(pending) < pgstore.RetryPendingLimitDefault {
		r.retry.after = ""
	} else {
		r.retry.after = pending[len(pending)-1].JobID
	}
	if len(pending) == 0 {
		return
	}
	refs := make([]asynqstate.TaskRef, len(pending))
	for i, p := range pending {
		refs[i] = asynqstate.TaskRef{Queue: p.Queue, ID: p.JobID}
	}
	statuses, err := live.state.TaskStatuses(ctx, refs)
	if err != nil {
		r.failed(ctx, res, stageList, "looking up the tasks of retry-reaped jobs failed; retried next pass", "jobs", len(refs), "err", err)
		return
	}
	var (
		active []pgstore.RetryPending
		gone   []pgstore.RetryPending
	)
	for i, p := range pending {
		switch statuses[i] {
		case asynqstate.TaskActive:
			active = append(active, p)
		case asynqstate.TaskArchived, asynqstate.TaskCompleted:
			replaced, isGone := r.replaceTask(ctx, p.JobID, p.Queue, p.Type, RetryDelay(p.RetryDelay, p.ReapCount), res)
			if replaced {
				res.RetriesFinished[RetryReenqueued]++
			} else if isGone {
				gone = append(gone, p)
			}
		case asynqstate.TaskNotFound, asynqstate.TaskQueueNotFound:
			gone = append(gone, p)
		}
	}
	if len(active) == 0 && len(gone) == 0 {
		return
	}
	// Looked at again a moment later: a delivery asynq just made is
	// claimed by the start guard within milliseconds (its cancel would
	// kill the retry itself), and another replica may be between the
	// delete and the enqueue of a replacement.
	active, gone = r.recheckRetries(ctx, active, gone, live.state, res)
	cancel := make([]string, len(active))
	for i, p := range active {
		cancel[i] = p.JobID
	}
	if len(cancel) > 0 {
		if c := r.retryCanceller(); c != nil {
			sent, err := c.Cancel(context.WithoutCancel(ctx), cancel)
			r.opts.Metrics.cancelsSent(sent)
			res.RetriesFinished[RetryCancelResent] += sent
			if err != nil {
				r.log.Warn("publishing asynq cancels of retry-reaped jobs failed again; retried next pass", "sent", sent, "of", len(cancel), "err", err)
			} else {
				r.log.Info("retry-reaped jobs still active a pass later: cancels sent again", "cancels", sent, "first_job_id", cancel[0])
			}
		}
	}
	r.failImpossible(ctx, gone, live, res)
}

// RetryRecheck is how long a pass waits before it looks a retry-reaped
// job's task up again, before cancelling it again (still active) or
// failing the job (still missing): the start guard claims a delivery
// within milliseconds, and another replica's delete and enqueue of a
// replacement take as long; the wait is a hundred times that.
const RetryRecheck = 500 * time.Millisecond

// recheckRetries waits RetryRecheck and returns those of active whose task
// is still active while their row is still QUEUED at the generation read
// (the hung attempt's, not a new delivery's), and those of gone whose task
// asynq still does not hold. Both are nil when the pass is stopped or a
// look-up fails (an error of the pass).
func (r *Reaper) recheckRetries(ctx context.Context, active, gone []pgstore.RetryPending, state AsynqState, res *Result) (stillActive, stillGone []pgstore.RetryPending) {
	// Real time, not Options.Clock: the wait is for other processes'
	// writes.
	timer := time.NewTimer(RetryRecheck)
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return nil, nil
	case <-timer.C:
	}
	all := append(append([]pgstore.RetryPending(nil), active...), gone...)
	refs := make([]asynqstate.TaskRef, len(all))
	ids := make([]string, len(all))
	for i, p := range all {
		refs[i] = asynqstate.TaskRef{Queue: p.Queue, ID: p.JobID}
		ids[i] = p.JobID
	}
	statuses, err := state.TaskStatuses(ctx, refs)
	if err != nil {
		r.failed(ctx, res, stageList, "looking up the tasks of retry-reaped jobs again failed; retried next pass", "jobs", len(refs), "err", err)
		return nil, nil
	}
	rows, err := r.store.LoadForTasks(ctx, ids)
	if err != nil {
		r.failed(ctx, res, stageLoad, "reading retry-reaped jobs again failed; retried next pass", "jobs", len(ids), "err", err)
		return nil, nil
	}
	for i, p := range all {
		row, ok := rows[p.JobID]
		if !ok || row.Status != jobs.StatusQueued || row.Generation != p.Generation {
			continue // claimed, requeued or ended meanwhile
		}
		switch st := statuses[i]; {
		case i < len(active) && st == asynqstate.TaskActive:
			stillActive = append(stillActive, p)
		case i >= len(active) && (st == asynqstate.TaskNotFound || st == asynqstate.TaskQueueNotFound):
			stillGone = append(stillGone, p)
		}
	}
	return stillActive, stillGone
}

// failImpossible fails retry-reaped jobs whose task is gone, those of
// queues a live asynq server serves, and writes their markers.
func (r *Reaper) failImpossible(ctx context.Context, gone []pgstore.RetryPending, live *liveServers, res *Result) {
	if len(gone) == 0 {
		return
	}
	servers, ok := r.liveQueues(ctx, live, res, "no retry-reaped job without a task is failed this pass")
	if !ok {
		return
	}
	var fail []pgstore.RetryPending
	for _, p := range gone {
		if servers[p.Queue] {
			fail = append(fail, p)
		}
	}
	if len(fail) == 0 {
		return
	}
	if l := r.opts.LeaderLease; l != nil && !l.Held() {
		return
	}
	failed, err := r.store.(RetryStore).FailRetryImpossible(ctx, fail)
	if errors.Is(err, pgstore.ErrLeaderLeaseLost) {
		r.log.Warn("failing retry-reaped jobs rolled back: this replica's leader lease lapsed before COMMIT", "jobs", len(fail))
		return
	}
	if err != nil {
		r.failed(ctx, res, stageReap, "failing retry-reaped jobs without a task failed; retried next pass", "jobs", len(fail), "err", err)
		return
	}
	for _, j := range failed {
		res.RetriesFinished[RetryFailedImpossible]++
		r.log.Warn("retry-reaped job failed: asynq holds no task to run it again (reap_retry_impossible)",
			"job_id", j.JobID, "type", j.Type, "reason", j.Evidence.Reason, "generation", j.Evidence.Generation)
	}
	r.setMarkers(ctx, failed, res)
}
