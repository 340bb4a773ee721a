package reaper

import (
	"context"
	"errors"
	"time"

	"github.com/jobreaper/jobreaper/internal/asynqstate"
	"github.com/jobreaper/jobreaper/internal/pgcore"
	"github.com/jobreaper/jobreaper/internal/pgstore"
	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/queue"
)

// judgeLoaded loads the rows and limits of batch (active task IDs,
// sorted, at most Options.LoadBatch) and decides on each, keeping the
// stalled ones in j: the pass reaps them once every task is judged
// (reapStalled), so that a stall storm is seen whole. A batch that fails
// to load is an error of the pass; the other batches go on.
func (r *Reaper) judgeLoaded(ctx context.Context, batch []string, now time.Time, debug bool, res *Result, j *judgement) {
	if ctx.Err() != nil {
		return
	}
	snaps, err := r.store.LoadForTasks(ctx, batch)
	if err != nil {
		j.loadFailed = true
		res.scannedAs(ScannedLoadFailed, len(batch))
		r.failed(ctx, res, stageLoad, "loading a batch of job rows failed; its jobs are not reaped this pass, the other batches go on",
			"tasks", len(batch), "err", err)
		return
	}
	for _, id := range batch {
		var snap *jobs.Snapshot
		if s, ok := snaps[id]; ok {
			snap = &s
			j.judged[queueOf(snap)]++
		} else {
			j.judged[""]++
		}
		v := Decide(snap, now, res.rule)
		if v.Reap {
			r.decidedReap(res, snap, v, jobs.ReasonStalled, DecideRetry(pgcore.BudgetOf(*snap), jobs.ReasonStalled, asynqstate.TaskActive))
		} else {
			r.decided(res, id, snap, v, jobs.ReasonStalled)
		}
		if AtRisk(v) {
			res.atRisk(snap.Type, snap.Queue)
		}
		if !v.Reap {
			if stallingSoon(snap, v, now, res.rule, heartbeatInterval(res.rule, r.opts.Interval)) {
				j.stalling[j.kinds.of(snap.Type, snap.Queue, v.StallTimeout)]++
			}
			res.skip(v.Skip, 1)
			res.scannedAs(string(v.Skip), 1)
			r.logSkip(id, snap, v, debug)
			continue
		}
		j.stalled = append(j.stalled, j.kinds.keep(snap, v))
	}
}

// reapSet reaps stalled jobs (sorted by ID) with reason, in set-based
// transactions of pgstore.ReapBatchSize, then sets the markers of each batch
// in one pipeline. A batch that fails (a deadlock, PostgreSQL down) is an
// error of the pass and nothing of it was written: the next pass retries.
// With reason stalled the jobs are scanned active tasks, and each one's
// outcome is counted in Result.ScannedBy. It returns true when every batch
// was tried and committed (or, in a dry run, counted): no batch failed,
// none was left to a lapsed leader lease or a stop.
func (r *Reaper) reapSet(ctx context.Context, stalled []stalledJob, reason string, res *Result) (complete bool) {
	return r.reapSetRule(ctx, stalled, reason, false, res)
}

// reapSetRule is reapSet; deadEarly makes each compare-and-set re-check
// the dead-early rule's database side (pgstore.ReapBatchParams.DeadEarly)
// instead of the full stall rule.
func (r *Reaper) reapSetRule(ctx context.Context, stalled []stalledJob, reason string, deadEarly bool, res *Result) (complete bool) {
	scanned := func(outcome string, n int) {
		if reason == jobs.ReasonStalled {
			res.scannedAs(outcome, n)
		}
	}
	if r.opts.DryRun {
		r.wouldReap(stalled, reason, res)
		scanned(jobs.ReasonStalled, len(stalled))
		return true
	}
	complete = true
	for start := 0; start < len(stalled); start += pgstore.ReapBatchSize {
		if ctx.Err() != nil {
			return false
		}
		if l := r.opts.LeaderLease; l != nil && !l.Held() {
			// By this host's clock the leader lease has lapsed (a pause, a
			// slow pass): no reap starts until an attempt holds it again.
			r.log.Warn("leader lease lapsed during the pass; no further reap this pass", "left", len(stalled)-start)
			scanned(ScannedLeaseLapsed, len(stalled)-start)
			return false
		}
		batch := stalled[start:min(start+pgstore.ReapBatchSize, len(stalled))]
		cands := make([]pgstore.ReapCandidate, len(batch))
		queues := make(map[string]string, len(batch))
		for i, sn := range batch {
			cands[i] = pgstore.ReapCandidate{JobID: sn.id, Generation: sn.generation, UpdatedAt: sn.updatedAt(),
				Retry: sn.plan == PlanRetry, RetryImpossible: sn.plan == PlanRetryImpossible}
			queues[sn.id] = sn.kind.queue
		}
		out, err := r.store.ReapBatch(ctx, pgstore.ReapBatchParams{Candidates: cands, Reason: reason, Rule: res.rule, DeadEarly: deadEarly})
		for _, f := range out.Failed {
			r.failed(ctx, res, stageReap, "reap failed for one job (its on_failed cascade); the rest of its batch went on, this job is retried next pass",
				"job_id", f.JobID, "err", f.Err)
		}
		scanned(ScannedReapFailed, len(out.Failed))
		complete = complete && len(out.Failed) == 0
		if errors.Is(err, pgstore.ErrLeaderLeaseLost) {
			// Not an error of the pass: the leader lease moved on, and the
			// new leader reaps what is still stalled.
			r.log.Warn("reap rolled back: this replica's leader lease lapsed before COMMIT; nothing of the batch was written",
				"jobs", len(batch), "first_job_id", batch[0].id)
			scanned(ScannedLeaseLapsed, len(stalled)-start-len(out.Failed))
			return false
		}
		if err != nil {
			scanned(ScannedReapFailed, len(batch)-len(out.Failed))
			msg := "reap of a batch failed; nothing of it was written, retried next pass"
			if errors.Is(err, pgstore.ErrDeadlock) {
				msg = "reap of a batch lost a deadlock (an operator cascade locks rows in another order); nothing of it was written, retried next pass"
			}
			r.failed(ctx, res, stageReap, msg, "jobs", len(batch), "first_job_id", batch[0].id, "err", err)
			complete = false
			continue
		}
		for _, id := range out.Changed {
			res.skip(SkipChangedSinceRead, 1)
			r.log.Info("job changed since the read; not reaped", "job_id", id)
		}
		scanned(string(SkipChangedSinceRead), len(out.Changed))
		scanned(jobs.ReasonStalled, len(out.Reaped))
		var failed, retried []pgstore.ReapedJob
		for _, j := range out.Reaped {
			ev := j.Evidence
			res.Reaped++
			res.ReapedBy[reason]++
			series := reapSeries{reason, labelValue(j.Type), labelValue(queues[j.JobID])}
			res.reapedSeries[series]++
			res.reapDelays = append(res.reapDelays, delaySample{labelValue(j.Type), reason, reapDelay(ev).Seconds()})
			if j.Retry {
				retried = append(retried, j)
				res.RetriedBy[reason]++
				res.retriedSeries[series]++
			} else {
				failed = append(failed, j)
			}
			r.log.Info("job reaped", "job_id", j.JobID, "type", j.Type, "reason", reason, "retry", j.Retry,
				"reap_count", ev.ReapCount, "reap_retries", ev.ReapRetries, "reap_retry_impossible", ev.ReapRetryImpossible,
				"generation", ev.Generation, "worker", ev.Worker, "runtime", ev.Runtime, "idle", ev.Idle,
				"max_runtime", ev.MaxRuntime, "stall_timeout", ev.StallTimeout)
		}
		r.setMarkers(ctx, failed, res)
		r.cancelHandlers(ctx, failed)
		r.afterRetries(ctx, retried, reason, queues, res)
	}
	return complete && ctx.Err() == nil
}

// setMarkers writes the markers of one committed batch of reaps, in one
// pipeline when the store can, then records the written ones in one
// statement. The reaps are committed, so the markers are written even when
// the pass is being stopped (the marker store bounds its calls with its own
// timeout). Each marker's 7 days run from now, just after the commit. A
// failed write is counted; the FAILED row still refuses the task, and a
// later pass re-sets the marker.
func (r *Reaper) setMarkers(ctx context.Context, reaped []pgstore.ReapedJob, res *Result) {
	if len(reaped) == 0 {
		return
	}
	mctx := context.WithoutCancel(ctx)
	writes := make([]asynqstate.MarkerWrite, len(reaped))
	for i, j := range reaped {
		writes[i] = asynqstate.MarkerWrite{JobID: j.JobID, Generation: j.Evidence.Generation, TTL: queue.MarkerTTL}
	}
	var results []asynqstate.MarkerResult
	if bm, ok := r.markers.(BatchMarkers); ok {
		results = bm.SetMany(mctx, writes)
	} else {
		results = make([]asynqstate.MarkerResult, len(writes))
		for i, w := range writes {
			results[i].Set, results[i].Err = r.markers.Set(mctx, w.JobID, w.Generation, w.TTL)
		}
	}
	// The reap recorded every marker as written (pgstore.Store.ReapBatch); only the
	// failed ones are recorded again, so the next pass re-sets them.
	var (
		failedRefs []pgstore.MarkerRef
		firstErr   error
	)
	for i, out := range results {
		if out.Err != nil {
			if firstErr == nil {
				firstErr = out.Err
			}
			failedRefs = append(failedRefs, pgstore.MarkerRef{JobID: writes[i].JobID, Generation: writes[i].Generation})
		}
	}
	if len(failedRefs) == 0 {
		return
	}
	r.failedN(mctx, res, stageMarker, len(failedRefs), "marker writes failed; the FAILED rows still refuse their tasks and a later pass re-sets the markers",
		"failed", len(failedRefs), "of", len(writes), "first_job_id", failedRefs[0].JobID, "err", firstErr)
	if err := r.store.MarkMarkersFailed(mctx, failedRefs); err != nil {
		r.log.Warn("could not record the failed marker writes; the markers are restored by the re-assertion of the last 7 days' markers instead",
			"markers", len(failedRefs), "err", err)
	}
}
