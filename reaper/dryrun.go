package reaper

import (
	"github.com/jobreaper/jobreaper/internal/pgcore"
	"github.com/jobreaper/jobreaper/jobs"
)

// Decision values of a dry run's decisions.
const (
	DecisionReap = "reap"
	DecisionSkip = "skip"
)

// Decision is what a pass decided about one job it looked at, as a dry run
// (Options.DryRun) reports it: the same Decide verdict a real pass acts on.
type Decision struct {
	JobID string `json:"job_id"`
	// Type, Queue and Worker are "" when unknown (no row, NULL).
	Type     string `json:"type"`
	Queue    string `json:"queue"`
	Decision string `json:"decision"`
	// Reason is the reap reason (stalled, lost_task) or the skip reason.
	Reason string `json:"reason"`
	// The durations are seconds; 0 where the verdict had none (no row, no
	// start time, unknown type).
	RuntimeSeconds      float64 `json:"runtime_seconds"`
	IdleSeconds         float64 `json:"idle_seconds"`
	MaxRuntimeSeconds   float64 `json:"max_runtime_seconds"`
	StallTimeoutSeconds float64 `json:"stall_timeout_seconds"`
	Generation          int64   `json:"generation"`
	Worker              string  `json:"worker"`
	// AtRisk: the job is left alone at risk of a reap soon (AtRisk), as
	// jobreaper_jobs_at_risk counts it; false for a reap decision.
	AtRisk bool `json:"at_risk"`
	// Retry is, for a reap that would be a retry reap, which retry of the
	// life it would be (reap_count + 1); 0 for a reap that fails the job
	// and for a skip. Retries is the type's reap_retries (0 when unknown).
	Retry   int `json:"retry"`
	Retries int `json:"retries"`
}

// decided records a decision on job id in a dry run; a real pass records
// nothing here. reapReason is the reason a reap verdict is acted on with.
func (r *Reaper) decided(res *Result, id string, snap *jobs.Snapshot, v Verdict, reapReason string) {
	if !r.opts.DryRun {
		r.note(res, id, snap, v, reapReason)
		return
	}
	d := decision(id, snap, v, reapReason)
	// A job judged twice in one pass (the lost-task check before a cycle's
	// reap looks its task up again) keeps its last decision.
	if i, ok := res.decided[id]; ok {
		res.Decisions[i] = d
		return
	}
	if res.decided == nil {
		res.decided = map[string]int{}
	}
	res.decided[id] = len(res.Decisions)
	res.Decisions = append(res.Decisions, d)
}

// decision is the Decision of verdict v on job id.
func decision(id string, snap *jobs.Snapshot, v Verdict, reapReason string) Decision {
	d := Decision{
		JobID: id, Decision: DecisionSkip, Reason: string(v.Skip),
		RuntimeSeconds: v.Runtime.Seconds(), IdleSeconds: v.Idle.Seconds(),
		MaxRuntimeSeconds: v.MaxRuntime.Seconds(), StallTimeoutSeconds: v.StallTimeout.Seconds(),
		AtRisk: AtRisk(v),
	}
	if v.Reap {
		d.Decision, d.Reason = DecisionReap, reapReason
	}
	if snap != nil {
		d.Type, d.Queue, d.Generation, d.Worker = snap.Type, snap.Queue, snap.Generation, snap.Worker
		d.Retries = pgcore.BudgetOf(*snap).Retries
	}
	return d
}

// decidedReap records, in a dry run, a reap verdict acted on with reason
// and plan: a retry reap records which retry of the life it would be.
func (r *Reaper) decidedReap(res *Result, snap *jobs.Snapshot, v Verdict, reason string, plan RetryPlan) {
	r.decided(res, snap.ID, snap, v, reason) // a real pass notes it for the pass record
	if r.opts.DryRun && plan == PlanRetry {
		res.Decisions[res.decided[snap.ID]].Retry = pgcore.BudgetOf(*snap).Count + 1
	}
}

// skipped returns v as a skip for reason, keeping its measurements: a
// stalled job the lost-task check leaves alone.
func (v Verdict) skipped(reason SkipReason) Verdict {
	v.Reap, v.Skip = false, reason
	return v
}

// wouldReap counts, in a dry run, the jobs a real pass would try to reap
// with reason (their compare-and-set may still find some changed).
func (r *Reaper) wouldReap(stalled []stalledJob, reason string, res *Result) {
	for _, sn := range stalled {
		res.Reaped++
		res.ReapedBy[reason]++
		series := reapSeries{reason, labelValue(sn.kind.typ), labelValue(sn.kind.queue)}
		res.reapedSeries[series]++
		if sn.plan == PlanRetry {
			res.RetriedBy[reason]++
			res.retriedSeries[series]++
		}
	}
}

// SkipLostLimit: in a dry run's decisions, a job the lost-task search found
// lost in a cycle that the mass-loss limit (Options.MaxLostPerPass)
// stopped: a real pass reaps none of that cycle's jobs.
const SkipLostLimit SkipReason = "lost_limit"

// heldByLimit turns, in a dry run, the lost_task reaps decided in a cycle
// the mass-loss limit stopped into skips (lost_limit), so that the
// decisions say what a real pass does: it reaps none of them.
func (r *Reaper) heldByLimit(res *Result) {
	if !r.opts.DryRun {
		return
	}
	for i, d := range res.Decisions {
		if d.Decision == DecisionReap && d.Reason == jobs.ReasonLostTask {
			res.Decisions[i].Decision, res.Decisions[i].Reason = DecisionSkip, string(SkipLostLimit)
		}
	}
}
