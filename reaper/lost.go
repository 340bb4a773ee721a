package reaper

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/jobreaper/jobreaper/internal/asynqstate"
	"github.com/jobreaper/jobreaper/internal/pgcore"
	"github.com/jobreaper/jobreaper/internal/pgstore"
	"github.com/jobreaper/jobreaper/jobs"
)

// SkipAwaitingRetry: a stalled PROCESSING job whose task is not active but
// waits in asynq's pending, scheduled, retry or aggregating set; asynq will
// run it again and the next claim takes the job over.
const SkipAwaitingRetry SkipReason = "awaiting_retry"

// SkipQueueNotFound: a stalled PROCESSING job whose task is not active and
// whose queue asynq does not know at all. Since the live-server guard, no
// pass counts it any more: such a job is reaped as lost_task when a live
// asynq server serves its queue, and held (SkipLostHeld) otherwise. The
// reason stays defined so that its metric series does not disappear.
const SkipQueueNotFound SkipReason = "queue_not_found"

// SkipLostHeld: a stalled PROCESSING job whose task asynq does not have
// (archived, completed, gone, or its queue unknown) while no live asynq
// server serves its queue in the Redis the daemon reads. A wrong Redis
// address or database looks exactly like that, so the job is held, never
// reaped, until a live server serves the queue.
const SkipLostHeld SkipReason = "lost_held"

// SkipNoQueue: a stalled PROCESSING job without a queue: its task cannot
// be looked up, so it is never reconciled, only counted.
const SkipNoQueue SkipReason = "no_queue"

// noQueueCountMax bounds how many rows without a queue one pass counts.
const noQueueCountMax = 10000

// AsynqState is what the lost-task search and the stale QUEUED report
// read from asynq: many task lookups at once, and the queues live servers
// serve; *asynqstate.StatusReader satisfies it.
type AsynqState interface {
	TaskStatuses(ctx context.Context, refs []asynqstate.TaskRef) ([]asynqstate.TaskStatus, error)
	LiveQueues(ctx context.Context) (map[string]bool, error)
}

// lostState carries the lost-task search across passes: the keyset cursor
// over the candidates, and, when a mass-loss limit is set, the lost jobs
// found so far in the cycle (reaped together at its end, or not at all).
type lostState struct {
	mu     sync.Mutex
	cursor pgstore.LostCursor
	found  []jobs.Snapshot
	// over: the cycle found more than the limit (found stops growing).
	over bool
}

// reapLost finds lost tasks: PROCESSING jobs of the queues listed
// completely this pass that are stalled by the same rule, whose task is not
// among the active ones and that asynq will never run again (archived,
// completed, gone, or its queue forgotten), as when a worker is killed on
// its task's last attempt or Redis lost its data.
//
// Candidates are visited by the keyset (updated_at, id), one page
// (pgstore.LostCandidatesLimitDefault rows) per daemon pass, the cursor kept
// across passes so that rows skipped as awaiting_retry or lost_held can
// never hide the ones behind them; with Options.Once every page is
// visited. Their tasks are looked up in one pipeline per page. A lost job
// is reaped with failure_reason lost_task by the set-based compare-and-set
// only while a live asynq server serves its queue (else it is held,
// lost_held, with a warning naming the likely causes), and, with
// Options.MaxLostPerPass set, only when the whole cycle over the candidates
// finds no more than that many: otherwise none is reaped that cycle (see
// endCycle). Rows without a queue are never considered; they are counted
// as no_queue.
//
// A job whose active entry has no lease (noLease) is judged as lost: its
// task hash says active, but asynq will never run nor recover it. live
// reads the live servers' queues at most once in the pass.
func (r *Reaper) reapLost(ctx context.Context, listed, active []string, noLease map[string]bool, live *liveServers, now time.Time, res *Result) {
	if ctx.Err() != nil {
		return
	}
	r.countNoQueue(ctx, active, res)
	if len(listed) == 0 {
		return
	}
	state := live.state
	st := &r.lost
	st.mu.Lock()
	defer st.mu.Unlock()
	held := map[string][]string{}
	defer r.warnHeld(held)
	for ctx.Err() == nil {
		cands, err := r.store.ListLostCandidates(ctx, pgstore.LostCandidatesParams{
			Queues: listed, Active: active, Rule: res.rule, Limit: pgstore.LostCandidatesLimitDefault, After: st.cursor,
		})
		if err != nil {
			r.failed(ctx, res, stageLoad, "looking for lost tasks failed; retried next pass", "err", err)
			return
		}
		lost, tasks, ok := r.judgeLost(ctx, state, cands, live, noLease, now, held, r.opts.MaxLostPerPass <= 0, res)
		if !ok {
			return
		}
		if len(cands) > 0 {
			last := cands[len(cands)-1]
			st.cursor = pgstore.LostCursor{UpdatedAt: last.UpdatedAt, ID: last.ID}
		}
		if r.opts.MaxLostPerPass <= 0 {
			r.reapSet(ctx, keepAll(lost, tasks), jobs.ReasonLostTask, res)
		} else if !st.over {
			st.found = append(st.found, lost...)
			if len(st.found) > r.opts.MaxLostPerPass {
				st.over, st.found = true, nil
			}
		}
		if len(cands) < pgstore.LostCandidatesLimitDefault {
			r.endCycle(ctx, live, noLease, now, res)
			return
		}
		if !r.opts.Once {
			return // the next pass goes on from the cursor
		}
	}
}

// judgeLost looks the tasks of cands up and returns the lost ones that a
// live server's queue allows to reap; the others are counted as skipped
// (awaiting_retry) or held (lost_held, collected by queue in held). It
// returns false when the lookup failed (an error of the pass). final is
// true when the lost ones are reaped next (no mass-loss limit, or the
// limit's look-up again at the end of the cycle): only then is each logged,
// so that a job is logged once, not once when found and again before its
// reap.
func (r *Reaper) judgeLost(ctx context.Context, state AsynqState, cands []jobs.Snapshot, live *liveServers,
	noLease map[string]bool, now time.Time, held map[string][]string, final bool, res *Result) ([]jobs.Snapshot, map[string]asynqstate.TaskStatus, bool) {
	var (
		judged   []jobs.Snapshot
		verdicts []Verdict
	)
	for _, snap := range cands {
		// The SQL used the same rule; Decide states it once more on this
		// pass's clock reading, so a job is never reaped on one side alone.
		v := Decide(&snap, now, res.rule)
		if !v.Reap {
			switch v.Skip { // rows the SQL returns because the rule cannot judge them: count them here
			case SkipBadRow, SkipUnknownType, SkipNoStartTime, SkipBadLimits:
				r.decided(res, snap.ID, &snap, v, "")
				res.skip(v.Skip, 1)
				r.logSkip(snap.ID, &snap, v, false)
			}
			continue
		}
		judged = append(judged, snap)
		verdicts = append(verdicts, v)
	}
	if len(judged) == 0 {
		return nil, nil, true
	}
	refs := make([]asynqstate.TaskRef, len(judged))
	for i, sn := range judged {
		refs[i] = asynqstate.TaskRef{Queue: sn.Queue, ID: sn.ID}
	}
	statuses, err := state.TaskStatuses(ctx, refs)
	if err != nil {
		r.failed(ctx, res, stageList, "looking up the tasks of stalled jobs failed; they are left alone this pass", "jobs", len(refs), "err", err)
		return nil, nil, false
	}
	var lost []jobs.Snapshot
	tasks := map[string]asynqstate.TaskStatus{}
	for i, snap := range judged {
		st := statuses[i]
		if st == asynqstate.TaskActive && !noLease[snap.ID] {
			continue // started since the listing: the next pass judges it
		}
		if st.WillRun() && st != asynqstate.TaskQueueNotFound && st != asynqstate.TaskActive {
			r.decided(res, snap.ID, &snap, verdicts[i].skipped(SkipAwaitingRetry), "")
			res.skip(SkipAwaitingRetry, 1)
			r.log.Debug("stalled job's task waits in asynq; left to its next attempt", "job_id", snap.ID, "task_status", st)
			continue
		}
		servers, ok := r.liveQueues(ctx, live, res, "no lost task is judged this pass")
		if !ok {
			return nil, nil, false
		}
		switch {
		case !servers[snap.Queue]:
			r.decided(res, snap.ID, &snap, verdicts[i].skipped(SkipLostHeld), "")
			res.skip(SkipLostHeld, 1)
			held[snap.Queue] = append(held[snap.Queue], snap.ID)
		default:
			if final {
				r.log.Info("stalled job's task will never run again", "job_id", snap.ID, "queue", snap.Queue, "task_status", st)
			}
			if noLease[snap.ID] {
				st = asynqstate.TaskNotFound // its broken active entry cannot be replaced
			}
			tasks[snap.ID] = st
			r.decidedReap(res, &snap, verdicts[i], jobs.ReasonLostTask, DecideRetry(pgcore.BudgetOf(snap), jobs.ReasonLostTask, st))
			lost = append(lost, snap)
		}
	}
	return lost, tasks, true
}

// endCycle ends a cycle over the lost-task candidates: the cursor goes
// back to the start and, with a mass-loss limit, the lost jobs found in
// the cycle are reaped together, or, when they are more than the limit,
// none is: an error naming the likely causes, Result.LostLimitTripped and
// jobreaper_lost_limit_tripped_total. Before they are reaped their tasks
// are looked up once more, so that one asynq was given back meanwhile is
// left to run.
func (r *Reaper) endCycle(ctx context.Context, live *liveServers, noLease map[string]bool, now time.Time, res *Result) {
	st := &r.lost
	found, over := st.found, st.over
	st.cursor, st.found, st.over = pgstore.LostCursor{}, nil, false
	if r.opts.MaxLostPerPass <= 0 {
		return
	}
	if over {
		res.LostLimitTripped = true
		r.heldByLimit(res)
		r.opts.Metrics.lostLimitTrip()
		r.failed(ctx, res, stageReap, "more stalled jobs than max_lost_per_pass would be reaped as lost_task in one cycle: none is reaped. "+
			"Likely causes: Redis was flushed, restarted without persistence or restored from an old snapshot while workers kept running. "+
			"Check asynq's data; once it is understood, run jobreaper run --once --max-lost-per-pass 0 to reap them",
			"max_lost_per_pass", r.opts.MaxLostPerPass)
		return
	}
	if len(found) == 0 {
		return
	}
	lost, tasks, ok := r.judgeLost(ctx, live.state, found, live, noLease, now, map[string][]string{}, true, res)
	if !ok {
		return
	}
	r.reapSet(ctx, keepAll(lost, tasks), jobs.ReasonLostTask, res)
}

// liveServers reads the queues live asynq servers serve (asynq's server
// registry) at most once per pass, on first need, and answers the same
// after: the marker hold and the lost-task search share it.
type liveServers struct {
	state AsynqState
	done  bool
	live  map[string]bool
	err   error
	// reported: the read's failure was counted as an error of the pass.
	reported bool
	// regDone, reg and regErr: the dead-early search's read of the whole
	// registry (liveRegistry), at most once per pass.
	regDone bool
	reg     asynqstate.Registry
	regErr  error
}

// liveQueues returns the queues live servers serve, and false when they
// could not be read: an error of the pass, counted once, whoever asks
// first; each asker logs what the pass does without them (without).
func (r *Reaper) liveQueues(ctx context.Context, l *liveServers, res *Result, without string) (map[string]bool, bool) {
	if !l.done {
		l.done = true
		if ds, ok := l.state.(DeadEarlyState); ok && !l.regDone {
			// One read of the registry serves the dead-early search too.
			l.regDone = true
			l.reg, l.regErr = ds.LiveServers(ctx)
			l.live, l.err = l.reg.Queues, l.regErr
		} else {
			l.live, l.err = l.state.LiveQueues(ctx)
		}
	}
	if l.err == nil {
		return l.live, true
	}
	if !l.reported {
		l.reported = true
		r.failed(ctx, res, stageList, "reading asynq's live servers failed; "+without, "err", l.err)
	} else if ctx.Err() == nil {
		r.log.Warn("asynq's live servers could not be read this pass (counted above); "+without, "err", l.err)
	}
	return nil, false
}

// warnHeld logs one warning per queue whose lost jobs were held this pass.
func (r *Reaper) warnHeld(held map[string][]string) {
	for q, ids := range held {
		r.log.Warn("stalled jobs held: asynq does not have their tasks, but no live asynq server serves their queue in the Redis "+
			"this daemon reads. Likely causes: a wrong Redis address or database (--redis-url), or no worker running for that queue. "+
			"They are reaped as lost_task once a live server serves the queue",
			"queue", q, "count", len(ids), "job_ids", brokenSample(ids))
	}
}

// countNoQueue counts the stalled PROCESSING rows without a queue whose
// task is not among the active ones: never reconciled, only counted.
func (r *Reaper) countNoQueue(ctx context.Context, active []string, res *Result) {
	ids, err := r.store.StalledWithoutQueue(ctx, res.rule, noQueueCountMax)
	if err != nil {
		r.failed(ctx, res, stageLoad, "counting stalled jobs without a queue failed", "err", err)
		return
	}
	n := 0
	for _, id := range ids {
		if _, isActive := slices.BinarySearch(active, id); !isActive {
			n++
		}
	}
	if n > 0 {
		res.skip(SkipNoQueue, n)
		r.log.Warn("stalled jobs without a queue: their task cannot be looked up, so they are never reconciled; give every row its queue",
			"count", n)
	}
}

// asynqState returns Options.Asynq, or the lister when it can answer for
// it.
func (r *Reaper) asynqState() AsynqState {
	if r.opts.Asynq != nil {
		return r.opts.Asynq
	}
	if s, ok := r.lister.(AsynqState); ok {
		return s
	}
	return lookupState{r.lister}
}

// lookupState answers for a reaper given no AsynqState: task states one
// lookup at a time through the lister, and no live server known, so that
// no lost task is ever reaped on a guess (each is held).
type lookupState struct{ lister Lister }

func (l lookupState) TaskStatuses(ctx context.Context, refs []asynqstate.TaskRef) ([]asynqstate.TaskStatus, error) {
	out := make([]asynqstate.TaskStatus, len(refs))
	for i, ref := range refs {
		st, err := l.lister.TaskStatus(ctx, ref.Queue, ref.ID)
		if err != nil {
			return nil, err
		}
		out[i] = st
	}
	return out, nil
}

func (lookupState) LiveQueues(context.Context) (map[string]bool, error) { return nil, errNoAsynqState }
