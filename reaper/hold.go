package reaper

import (
	"cmp"
	"context"
	"maps"
	"slices"
	"time"

	"github.com/jobreaper/jobreaper/internal/broken"
	"github.com/jobreaper/jobreaper/internal/pgstore"
	"github.com/jobreaper/jobreaper/jobs"
)

// HoldReport is a stall-storm hold in effect for a pass's queues, as
// Result.StallStormHolds reports it.
type HoldReport struct {
	// ID is the reaper_holds row's; 0 for the hold a dry run would start.
	ID int64 `json:"id"`
	// Queues are the queues it holds, Types the job types of the jobs held
	// when it started.
	Queues []string `json:"queues"`
	Types  []string `json:"types"`
	// Held counts the stalled jobs this pass left alone because of it.
	Held int `json:"held"`
	// Started is true when this pass started it (a dry run: would have).
	Started bool `json:"started"`
	// Tripped says which limit tripped, with its values.
	Tripped   string    `json:"tripped"`
	StartedAt time.Time `json:"started_at"`
	// Until is when it ends unless released first (the database clock).
	Until time.Time `json:"until"`
}

// holdsOf is how the holds read by one pass stand for its queues.
type holdsOf struct {
	// on maps each queue a hold holds to that hold.
	on map[string]*pgstore.Hold
	// over maps each queue whose first pass after a hold's end this is
	// to the IDs of those holds.
	over map[string][]int64
	// ended are the holds that are over and not drained, for the log.
	ended []*pgstore.Hold
}

// classifyHolds sorts holds by how they stand at now for the queues of
// read (the pass's): the queues each hold in effect holds, and those of
// read whose first pass after a hold's end this is.
func classifyHolds(holds []pgstore.Hold, read []string, now time.Time) holdsOf {
	h := holdsOf{on: map[string]*pgstore.Hold{}, over: map[string][]int64{}}
	for i := range holds {
		hold := &holds[i]
		if hold.InEffect(now) {
			for _, q := range hold.Queues {
				h.on[q] = hold
			}
		}
	}
	for i := range holds {
		hold := &holds[i]
		if hold.InEffect(now) {
			continue
		}
		acts := false
		for _, q := range hold.Queues {
			// A queue held by a hold in effect stays held, whatever
			// ended before; one another replica's pass drained, or that
			// this pass does not scan, is not this pass's to act on.
			if _, ours := slices.BinarySearch(read, q); ours && h.on[q] == nil && !slices.Contains(hold.Drained, q) {
				h.over[q] = append(h.over[q], hold.ID)
				acts = true
			}
		}
		if acts {
			h.ended = append(h.ended, hold)
		}
	}
	return h
}

// checked reports whether the storm check applies to q this pass: no
// hold holds it, and this is not the first pass after one's end.
func (h holdsOf) checked(q string) bool { return h.on[q] == nil && h.over[q] == nil }

// reapStalled ends a pass's judging. It reads, in one statement, the
// holds naming the pass's queues (or those of its stalled jobs); skips as
// stall_storm_held the stalled jobs of the queues a hold holds; reaps at
// once those of the queues whose hold is over (the first pass after its
// end or release: no storm check, and the end is recorded once they are
// reaped, so later passes check them again); and checks the rest with
// StormCheck: within the limits they are reaped set-based, otherwise none
// is, and a hold on their queues is recorded (a dry run only says it
// would). A hold that cannot be read or recorded is an error of the pass,
// and no stalled job it could cover is reaped.
func (r *Reaper) reapStalled(ctx context.Context, j *judgement, queues, listed []string, now time.Time, res *Result) {
	if ctx.Err() != nil {
		return
	}
	read := slices.Clone(queues)
	for k := range j.kinds {
		read = append(read, k.heldQueue())
	}
	read = union(read, nil)
	holds, err := r.store.OpenHolds(ctx, read)
	if err != nil {
		res.scannedAs(ScannedHoldsUnread, len(j.stalled))
		r.failed(ctx, res, stageLoad, "reading the stall-storm holds failed; no stalled job is reaped this pass",
			"stalled", len(j.stalled), "err", err)
		return
	}
	h := classifyHolds(holds, read, now)
	for _, hold := range h.ended {
		r.logHoldOver(hold)
	}
	started := r.checkStorm(ctx, j, &h, now, res)
	// Partition in place: the held jobs are counted and dropped, the rest
	// reaped.
	heldBy := map[*pgstore.Hold]int{}
	reap, stillStalled := j.stalled[:0], 0
	for _, s := range j.stalled {
		q := s.kind.heldQueue()
		if hold := h.on[q]; hold != nil {
			heldBy[hold]++
			r.heldInDryRun(res, s.id)
			// A held job is stalled: past max_runtime, idle for its whole
			// stall timeout, so AtRisk of its verdict held is true.
			res.atRisk(s.kind.typ, s.kind.queue)
			continue
		}
		if h.over[q] != nil {
			stillStalled++
		}
		reap = append(reap, s)
	}
	held := len(j.stalled) - len(reap)
	res.StallStormHeld += held
	res.skip(SkipStallStormHeld, held)
	res.scannedAs(string(SkipStallStormHeld), held)
	r.reportHolds(h, heldBy, started, res)
	sortStalled(reap)
	complete := r.reapSet(ctx, reap, jobs.ReasonStalled, res)
	if len(h.over) > 0 && !r.opts.DryRun && complete && !j.loadFailed {
		r.drainHolds(ctx, h, listed, stillStalled, now, res)
	}
}

// checkStorm applies StormCheck to the stalled jobs of the queues no hold
// covers, among the tasks of those queues the pass judged. On a storm it
// records a hold on their queues (a dry run does not) and adds it to h,
// and returns it (nil without a storm).
func (r *Reaper) checkStorm(ctx context.Context, j *judgement, h *holdsOf, now time.Time, res *Result) *pgstore.Hold {
	if broken.Storm {
		return nil
	}
	var (
		stalled, stalling, judged int
		queues, types             []string
		longest                   time.Duration
	)
	// Queues, types and stall timeouts per kind (a handful), not per job;
	// the kinds of the jobs stalling soon too, since the hold must cover
	// them (they stall in the next passes).
	checked := map[*jobKind]bool{}
	for _, k := range j.kinds {
		if q := k.heldQueue(); h.checked(q) {
			checked[k] = true
			queues, types = append(queues, q), append(types, k.typ)
			longest = max(longest, k.stall)
		}
	}
	for _, s := range j.stalled {
		if checked[s.kind] {
			stalled++
		}
	}
	for k, n := range j.stalling {
		if checked[k] {
			stalling += n
		}
	}
	for q, n := range j.judged {
		if q == "" || h.checked(q) {
			judged += n
		}
	}
	storm := StormCheck(stalled, stalling, judged, StormLimits{MaxStalled: r.opts.MaxStalledPerPass, MaxFraction: r.opts.MaxStalledFraction})
	if !storm.Hold {
		return nil
	}
	queues, types = union(queues, nil), union(types, nil)
	// Unset, a hold lasts the longest stall timeout among the held jobs:
	// a worker that lost PostgreSQL for less than that has had its whole
	// stall timeout again to show progress before anything is reaped.
	holdFor := cmp.Or(r.opts.StallStormHold, longest)
	hold := &pgstore.Hold{Queues: queues, Types: types, Held: stalled, Judged: judged, Tripped: storm.Why,
		StartedAt: now, Until: now.Add(holdFor)}
	if !r.opts.DryRun {
		recorded, err := r.store.StartHold(ctx, pgstore.StartHoldParams{Queues: queues, Types: types, Held: stalled, Judged: judged,
			Tripped: storm.Why, For: holdFor})
		if err != nil {
			// Not reaped all the same: holding them this pass is what the
			// limits ask for, and the next pass tries to record it again.
			r.failed(ctx, res, stageReap, "a stall storm: none of its stalled jobs is reaped, but recording the hold on their queues failed; the next pass checks them again",
				"stalled", stalled, "judged", judged, "queues", queues, "types", types, "limit", storm.Limit, "err", err)
		} else {
			hold = &recorded
			r.opts.Metrics.stallStorm()
		}
	}
	for _, q := range queues {
		h.on[q] = hold
		delete(h.over, q)
	}
	msg := "stall storm: too many active jobs went idle at once to be real stalls (their workers lost PostgreSQL?); none is reaped, " +
		"their queues are held until the hold ends, then the jobs still stalled are reaped together (jobreaper release-hold ends it at once)"
	if r.opts.DryRun {
		msg = "dry run: a stall storm; a real pass would reap none of its stalled jobs and hold their queues"
	}
	r.log.Warn(msg, "stalled", stalled, "stalling_soon", stalling, "judged", judged, "types", types, "queues", queues, "limit", storm.Limit,
		"why", storm.Why, "hold_id", hold.ID, "until", hold.Until, "hold_for", hold.Until.Sub(hold.StartedAt))
	return hold
}

// reportHolds fills Result.StallStormHolds with the holds in effect for
// the pass's queues, and logs how many jobs each held.
func (r *Reaper) reportHolds(h holdsOf, heldBy map[*pgstore.Hold]int, started *pgstore.Hold, res *Result) {
	seen := map[*pgstore.Hold]bool{}
	for _, q := range slices.Sorted(maps.Keys(h.on)) {
		hold := h.on[q]
		if seen[hold] || hold.ID == 0 && !r.opts.DryRun {
			continue // seen, or a hold whose recording failed (an error of the pass)
		}
		seen[hold] = true
		res.StallStormHolds = append(res.StallStormHolds, HoldReport{ID: hold.ID, Queues: hold.Queues, Types: hold.Types,
			Held: heldBy[hold], Started: hold == started, Tripped: hold.Tripped, StartedAt: hold.StartedAt, Until: hold.Until})
		if hold != started && heldBy[hold] > 0 {
			r.log.Info("stalled jobs held by a stall-storm hold; reaped together once it ends (jobreaper release-hold ends it at once)",
				"hold_id", hold.ID, "held", heldBy[hold], "queues", hold.Queues, "until", hold.Until)
		}
	}
}

// logHoldOver notes a hold whose end (or release) this pass acts on.
func (r *Reaper) logHoldOver(hold *pgstore.Hold) {
	attrs := []any{"hold_id", hold.ID, "queues", hold.Queues, "started_at", hold.StartedAt, "until", hold.Until}
	if hold.ReleasedAt != nil {
		r.log.Info("stall-storm hold released by an operator: the jobs still stalled in its queues are reaped now, together",
			append(attrs, "released_at", *hold.ReleasedAt, "released_by", hold.ReleasedBy, "reason", hold.Reason)...)
		return
	}
	r.log.Info("stall-storm hold ended: the jobs still stalled in its queues are reaped now, together", attrs...)
}

// drainHolds records that this pass, the first after the end of the holds
// in h.over, reaped the stalled jobs of those of their queues it listed
// whole, so that later passes check them again. A failure is an error of
// the pass; the next pass is then again the first after.
func (r *Reaper) drainHolds(ctx context.Context, h holdsOf, listed []string, stillStalled int, now time.Time, res *Result) {
	var ids []int64
	var queues []string
	for _, q := range listed {
		if over := h.over[q]; over != nil {
			ids = append(ids, over...)
			queues = append(queues, q)
		}
	}
	if len(queues) == 0 {
		return
	}
	slices.Sort(ids)
	ids = slices.Compact(ids)
	if err := r.store.DrainHolds(ctx, ids, queues, now); err != nil {
		r.failed(ctx, res, stageReap, "recording the end of a stall-storm hold failed; the next pass reaps its queues' stalled jobs again without the storm check",
			"hold_ids", ids, "queues", queues, "err", err)
		return
	}
	r.log.Info("stall-storm hold drained: the jobs of its queues still stalled after it were reaped together (those that made progress meanwhile were saved); later passes check these queues again",
		"hold_ids", ids, "queues", queues, "still_stalled", stillStalled)
}

// heldInDryRun turns, in a dry run, the stalled reap decided on job id
// into a skip (stall_storm_held), so that the decisions say what a real
// pass does.
func (r *Reaper) heldInDryRun(res *Result, id string) {
	if !r.opts.DryRun {
		return
	}
	if i, ok := res.decided[id]; ok && res.Decisions[i].Decision == DecisionReap {
		res.Decisions[i].Decision, res.Decisions[i].Reason = DecisionSkip, string(SkipStallStormHeld)
		res.Decisions[i].AtRisk = true
	}
}
