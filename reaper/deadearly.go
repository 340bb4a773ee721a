package reaper

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jobreaper/jobreaper/internal/asynqstate"
	"github.com/jobreaper/jobreaper/internal/pgcore"
	"github.com/jobreaper/jobreaper/internal/pgstore"
	"github.com/jobreaper/jobreaper/jobs"
)

// DeadAttempt is what the dead-early rule knows of one job besides its
// row: its type's opt-in, and asynq's side, read by the pass.
type DeadAttempt struct {
	// OptedIn: the job's type has reap_dead_early set.
	OptedIn bool
	// Task is where asynq holds the job's task, and LastErr the last
	// error asynq recorded on it.
	Task    asynqstate.TaskStatus
	LastErr string
	// QueueServed: a live asynq server serves the job's queue.
	QueueServed bool
	// LiveProcesses are "<host>:<pid>" of every server in asynq's
	// live-server registry (asynqstate.Registry.Processes).
	LiveProcesses map[string]bool
}

// DeadEarlyVerdict is DecideDeadEarly's answer.
type DeadEarlyVerdict struct {
	// Reap is true when the job is reaped as lost_task now, before its
	// max_runtime; Why says otherwise which condition failed.
	Reap bool
	Why  string
	// Verdict is Decide's, with Runtime, Idle and the limits applied.
	Verdict Verdict
}

// DecideDeadEarly is the dead-early rule in Go, with no I/O: a job whose
// runtime has not passed max_runtime (past it, Decide's full rule judges
// it) is reaped as lost_task when all of these hold:
//   - its type opted in (job_types.reap_dead_early) and its limits are
//     sane, as Decide requires;
//   - its idle time, counted from the later of updated_at and
//     rule.OutageEnd, is at least its stall timeout (a worker cut off from
//     Redis but not from PostgreSQL keeps heartbeating, so this never
//     holds for it);
//   - asynq holds its task archived or completed with the last error
//     asynqstate.ErrLeaseExpiredText, or no longer holds it;
//   - a live asynq server serves its queue (else a wrong Redis looks the
//     same);
//   - the worker that claimed it is named by the start guard's default
//     "<host>:<pid>" and no live asynq server runs in that process. A
//     worker named otherwise (queue.WithWorker) never takes this path.
//
// now must be the database clock's reading. pgstore.DeadEarlyPredicate
// states the database side in SQL, and the reap's compare-and-set
// re-checks it.
func DecideDeadEarly(snap *jobs.Snapshot, now time.Time, rule pgstore.StallRule, a DeadAttempt) DeadEarlyVerdict {
	v := Decide(snap, now, rule)
	out := DeadEarlyVerdict{Verdict: v}
	switch {
	case v.Reap:
		out.Why = "stalled by the full rule"
		return out
	case v.Skip != SkipWithinLimit:
		out.Why = "not within max_runtime: " + string(v.Skip)
		return out
	case !a.OptedIn:
		out.Why = "its type has not opted into reap_dead_early"
		return out
	}
	rule = rule.InMicroseconds()
	_, stallUs, _ := pgstore.LimitsMicros(snap.Limits)
	if stallUs == nil {
		stallUs = ptr(rule.DefaultStallTimeout.Microseconds())
	}
	from := snap.UpdatedAt
	if rule.OutageEnd.After(from) {
		from = rule.OutageEnd
	}
	switch {
	case microsBetween(from, now) < *stallUs:
		out.Why = "idle for less than its stall timeout"
	case !leaseExpired(a.Task, a.LastErr):
		out.Why = "asynq has not expired its task's lease: task " + string(a.Task)
	case !a.QueueServed:
		out.Why = "no live asynq server serves its queue"
	case !defaultWorkerName(snap.Worker):
		out.Why = "its worker is not named host:pid"
	case a.LiveProcesses[snap.Worker]:
		out.Why = "its worker is in asynq's live-server registry"
	default:
		out.Reap = true
		out.Verdict.Reap, out.Verdict.Skip = true, ""
	}
	return out
}

// leaseExpired reports whether asynq's answer for a task says its last
// attempt's lease expired and it will never run again: archived or
// completed with asynq's lease-expired error, or gone.
func leaseExpired(st asynqstate.TaskStatus, lastErr string) bool {
	switch st {
	case asynqstate.TaskArchived, asynqstate.TaskCompleted:
		return lastErr == asynqstate.ErrLeaseExpiredText
	case asynqstate.TaskNotFound, asynqstate.TaskQueueNotFound:
		return true
	}
	return false
}

// defaultWorkerName reports whether name has the start guard's default
// form, "<host>:<pid>" with a non-empty host and a positive decimal pid.
func defaultWorkerName(name string) bool {
	i := strings.LastIndexByte(name, ':')
	if i <= 0 {
		return false
	}
	pid := name[i+1:]
	if pid == "" || strings.TrimLeft(pid, "0123456789") != "" {
		return false
	}
	n, err := strconv.Atoi(pid)
	return err == nil && n > 0
}

// DeadEarlyState is what the dead-early rule reads from asynq besides
// AsynqState: the live-server registry (once per pass) and the last error
// of a few tasks. *asynqstate.StatusReader satisfies it; a reaper whose
// AsynqState does not never reaps a job early.
type DeadEarlyState interface {
	LiveServers(ctx context.Context) (asynqstate.Registry, error)
	TaskEnds(ctx context.Context, refs []asynqstate.TaskRef) ([]asynqstate.TaskEnd, error)
}

// deadEarlyState is the dead-early search's cursor across passes.
type deadEarlyState struct {
	mu     sync.Mutex
	cursor pgstore.LostCursor
}

// reapDeadEarly reaps, as lost_task, the dead attempts of types that opted
// into reap_dead_early (DecideDeadEarly) among the PROCESSING rows of the
// queues listed completely this pass whose task is not active: one page
// of pgstore.DeadEarlyLimitDefault candidates per pass, the cursor kept
// across passes (with Options.Once, every page). asynq's registry is read
// once per pass, and only when some candidate was found (no type opted in:
// no Redis read at all); each candidate's task is looked up with its last
// error. A pass that would reap more than Options.MaxLostPerPass this way
// reaps none of them (an error of the pass), as the lost-task search's
// mass-loss limit.
func (r *Reaper) reapDeadEarly(ctx context.Context, listed, active []string, noLease map[string]bool, live *liveServers, now time.Time, res *Result) {
	if ctx.Err() != nil || len(listed) == 0 {
		return
	}
	ds, ok := live.state.(DeadEarlyState)
	if !ok {
		return
	}
	st := &r.deadEarly
	st.mu.Lock()
	defer st.mu.Unlock()
	var lost []jobs.Snapshot
	tasks := map[string]asynqstate.TaskStatus{} // each reaped job's task, for its retry decision
	for ctx.Err() == nil {
		cands, err := r.store.ListDeadEarlyCandidates(ctx, pgstore.DeadEarlyCandidatesParams{
			Queues: listed, Rule: res.rule, Limit: pgstore.DeadEarlyLimitDefault, After: st.cursor,
		})
		if err != nil {
			r.failed(ctx, res, stageLoad, "looking for dead attempts of reap_dead_early types failed; retried next pass", "err", err)
			return
		}
		page, ok := r.judgeDeadEarly(ctx, ds, cands, active, noLease, live, now, tasks, res)
		if !ok {
			return
		}
		lost = append(lost, page...)
		st.cursor = pgstore.LostCursor{}
		if len(cands) == pgstore.DeadEarlyLimitDefault {
			last := cands[len(cands)-1]
			st.cursor = pgstore.LostCursor{UpdatedAt: last.UpdatedAt, ID: last.ID}
		}
		if len(cands) < pgstore.DeadEarlyLimitDefault || !r.opts.Once {
			break
		}
	}
	if len(lost) == 0 {
		return
	}
	if max := r.opts.MaxLostPerPass; max > 0 && len(lost) > max {
		res.LostLimitTripped = true
		r.heldByLimit(res)
		r.opts.Metrics.lostLimitTrip()
		r.failed(ctx, res, stageReap, "more dead attempts of reap_dead_early types than max_lost_per_pass would be reaped as lost_task in one pass: none is reaped; "+
			"they are reaped by the full rule at max_runtime, or by a pass with --max-lost-per-pass 0", "found", len(lost), "max_lost_per_pass", max)
		return
	}
	r.reapSetRule(ctx, keepAll(lost, tasks), jobs.ReasonLostTask, true, res)
}

// judgeDeadEarly returns the candidates DecideDeadEarly reaps, recording
// each one's task status in tasks (for its retry decision). It returns
// false when asynq could not be read (an error of the pass).
func (r *Reaper) judgeDeadEarly(ctx context.Context, ds DeadEarlyState, cands []jobs.Snapshot, active []string, noLease map[string]bool,
	live *liveServers, now time.Time, tasks map[string]asynqstate.TaskStatus, res *Result) ([]jobs.Snapshot, bool) {
	activeSet := make(map[string]bool, len(active))
	for _, id := range active {
		activeSet[id] = true
	}
	var judged []jobs.Snapshot
	for _, sn := range cands {
		if activeSet[sn.ID] && !noLease[sn.ID] {
			continue // its task runs: the worker holds its lease
		}
		judged = append(judged, sn)
	}
	if len(judged) == 0 {
		return nil, true
	}
	reg, ok := r.liveRegistry(ctx, ds, live, res)
	if !ok {
		return nil, false
	}
	refs := make([]asynqstate.TaskRef, len(judged))
	for i, sn := range judged {
		refs[i] = asynqstate.TaskRef{Queue: sn.Queue, ID: sn.ID}
	}
	ends, err := ds.TaskEnds(ctx, refs)
	if err != nil {
		r.failed(ctx, res, stageList, "looking up the tasks of dead attempts failed; they are left alone this pass", "jobs", len(refs), "err", err)
		return nil, false
	}
	var lost []jobs.Snapshot
	for i, sn := range judged {
		v := DecideDeadEarly(&sn, now, res.rule, DeadAttempt{OptedIn: true, Task: ends[i].Status, LastErr: ends[i].LastErr,
			QueueServed: reg.Queues[sn.Queue], LiveProcesses: reg.Processes})
		if !v.Reap {
			r.log.Debug("job of a reap_dead_early type left to the full rule", "job_id", sn.ID, "why", v.Why)
			continue
		}
		r.log.Info("dead attempt: its worker left asynq's registry and its task's lease expired; reaped before max_runtime",
			"job_id", sn.ID, "queue", sn.Queue, "worker", sn.Worker, "task_status", ends[i].Status, "runtime", v.Verdict.Runtime, "idle", v.Verdict.Idle)
		tasks[sn.ID] = ends[i].Status
		r.decidedReap(res, &sn, v.Verdict, jobs.ReasonLostTask, DecideRetry(pgcore.BudgetOf(sn), jobs.ReasonLostTask, ends[i].Status))
		lost = append(lost, sn)
	}
	return lost, true
}

// liveRegistry reads asynq's live-server registry at most once per pass
// (the queues it gives serve the lost-task search too), and returns false
// when it could not be read: an error of the pass, counted once.
func (r *Reaper) liveRegistry(ctx context.Context, ds DeadEarlyState, l *liveServers, res *Result) (asynqstate.Registry, bool) {
	if !l.regDone {
		l.regDone = true
		l.reg, l.regErr = ds.LiveServers(ctx)
		if !l.done {
			l.done, l.live, l.err = true, l.reg.Queues, l.regErr
		}
	}
	if l.regErr != nil {
		if !l.reported {
			l.reported = true
			r.failed(ctx, res, stageList, "reading asynq's live-server registry failed; no job is reaped early this pass", "err", l.regErr)
		} else if ctx.Err() == nil {
			r.log.Warn("asynq's live servers could not be read this pass (counted above); no job is reaped early this pass", "err", l.regErr)
		}
		return asynqstate.Registry{}, false
	}
	return l.reg, true
}
