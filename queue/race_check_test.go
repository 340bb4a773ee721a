package queue_test

import (
	"context"
	"errors"
	"sort"

	"github.com/hibiken/asynq"

	"github.com/jobreaper/jobreaper/internal/pgcore"
	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/queue"
)

// The invariants checked after every interleaving, on what landed in
// PostgreSQL and Redis and on what the goroutines were told.

// check runs every invariant on the interleaving and records violations.
func (r *raceRun) check(ctx context.Context) {
	rec := r.rec
	rows, err := r.s.wide.Pool.Query(ctx, raceCheckSQL, r.ids, pgcore.Interval(r.plan.stall))
	if err != nil {
		rec.lockedViolate("running the checks: %v", err)
		return
	}
	for rows.Next() {
		var (
			i      int
			detail string
		)
		if err := rows.Scan(&i, &detail); err != nil {
			rec.lockedViolate("reading the checks: %v", err)
			break
		}
		c := raceChecks[i]
		rec.note(func() {
			rec.violate("%s: %s", c.name, detail)
			if c.lost {
				rec.lost++
			}
		})
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		rec.lockedViolate("running the checks: %v", err)
	}
	landed := r.landed(ctx)
	r.checkAnswers(landed)
	r.checkMarkers(ctx, landed)
	r.checkGuard(ctx)
	r.s.saw(landed.counts(rec))
}

// landedWrites is what the interleaving wrote, as race_writes and
// race_batches recorded it.
type landedWrites struct {
	byKind  map[string]map[attemptRef]int
	beats   map[beatRef]bool
	reasons map[attemptRef]string
	batches map[batchRef]bool
	late    int
}

func (r *raceRun) landed(ctx context.Context) landedWrites {
	l := landedWrites{byKind: map[string]map[attemptRef]int{}, beats: map[beatRef]bool{},
		reasons: map[attemptRef]string{}, batches: map[batchRef]bool{}}
	fail := func(err error) landedWrites {
		r.rec.lockedViolate("reading what landed: %v", err)
		return l
	}
	rows, err := r.s.wide.Pool.Query(ctx, raceWrites+`
SELECT kind, job_id, new_gen, new_mark, coalesce(new_reason, '') FROM w`, r.ids)
	if err != nil {
		return fail(err)
	}
	for rows.Next() {
		var (
			kind, reason string
			ref          attemptRef
			mark         int64
		)
		if err := rows.Scan(&kind, &ref.job, &ref.gen, &mark, &reason); err != nil {
			rows.Close()
			return fail(err)
		}
		if l.byKind[kind] == nil {
			l.byKind[kind] = map[attemptRef]int{}
		}
		l.byKind[kind][ref]++
		switch kind {
		case "heartbeat":
			l.beats[beatRef{ref.job, ref.gen, mark}] = true
		case "failed", "reaped":
			l.reasons[ref] = reason
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return fail(err)
	}
	rows, err = r.s.wide.Pool.Query(ctx, `SELECT job_id, generation, token FROM race_batches WHERE job_id = ANY($1)`, r.ids)
	if err != nil {
		return fail(err)
	}
	for rows.Next() {
		var b batchRef
		if err := rows.Scan(&b.job, &b.gen, &b.token); err != nil {
			rows.Close()
			return fail(err)
		}
		l.batches[b] = true
	}
	rows.Close()
	if err := r.s.wide.Pool.QueryRow(ctx, `SELECT count(*) FROM job_events WHERE job_id = ANY($1) AND kind = 'late_result_rejected'`,
		r.ids).Scan(&l.late); err != nil {
		return fail(err)
	}
	return l
}

// counts returns how many writes of each kind landed, for the suite's
// coverage counts.
func (l landedWrites) counts(rec *records) map[string]int {
	out := map[string]int{"late_result_rejected": l.late}
	for kind, refs := range l.byKind {
		for _, n := range refs {
			out[kind] += n
		}
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	out["second_life"], out["replayed"], out["guard_refused_reaped"] = rec.relives, rec.replays, rec.guardReaped
	return out
}

// checkAnswers holds what each API call answered against what landed: a
// success the caller was told of landed, and a write landed only where a
// caller was told of its success.
func (r *raceRun) checkAnswers(l landedWrites) {
	rec := r.rec
	rec.mu.Lock()
	defer rec.mu.Unlock()
	for ref, n := range rec.handlers {
		if n != 1 || l.byKind["claimed"][ref] != 1 {
			rec.violate("the handler of %s:%d ran %d times on %d claims", ref.job, ref.gen, n, l.byKind["claimed"][ref])
		}
	}
	for ref := range l.byKind["claimed"] {
		if rec.handlers[ref] == 0 {
			rec.violate("%s:%d was claimed without its handler running", ref.job, ref.gen)
		}
	}
	sameKeys(rec, "completion", rec.completed, l.byKind["completed"])
	for b := range rec.batches {
		if !l.batches[b] {
			rec.violate("batch %s of %s:%d was answered as recorded but did not land", b.token, b.job, b.gen)
		}
	}
	for b := range l.batches {
		if !rec.batches[b] {
			rec.violate("batch %s of %s:%d landed but its Advance was not answered as recorded", b.token, b.job, b.gen)
		}
	}
	for ref, code := range rec.failed {
		if l.byKind["failed"][ref] != 1 || l.reasons[ref] != code {
			rec.violate("Fail(%s) of %s:%d succeeded but the row was failed %d times with %q", code, ref.job, ref.gen,
				l.byKind["failed"][ref], l.reasons[ref])
		}
	}
	for ref := range rec.released {
		if l.byKind["released"][ref] != 1 {
			rec.violate("Release of %s:%d succeeded but %d releases landed", ref.job, ref.gen, l.byKind["released"][ref])
		}
	}
	for b := range rec.beats {
		if !l.beats[b] {
			rec.violate("heartbeat %d of %s:%d was answered as written but did not land", b.mark, b.job, b.gen)
		}
	}
	for b := range l.beats {
		if !rec.beats[b] {
			rec.violate("heartbeat %d of %s:%d landed but was not answered as written", b.mark, b.job, b.gen)
		}
	}
	reaped := 0
	for _, n := range l.byKind["reaped"] {
		reaped += n
	}
	if reaped != rec.passReaped {
		rec.violate("the passes reported %d reaps, %d landed", rec.passReaped, reaped)
	}
	for job, n := range rec.charged {
		if n > 1 {
			rec.violate("%s was reported charged %d times", job, n)
		}
	}
}

// sameKeys records a violation for every attempt in only one of told (the
// callers were told it happened) and landed.
func sameKeys(rec *records, what string, told map[attemptRef]bool, landed map[attemptRef]int) {
	for ref := range told {
		if landed[ref] != 1 {
			rec.violate("a %s of %s:%d was confirmed but %d landed", what, ref.job, ref.gen, landed[ref])
		}
	}
	for ref, n := range landed {
		if !told[ref] {
			rec.violate("%d %s of %s:%d landed without being confirmed", n, what, ref.job, ref.gen)
		}
	}
}

// checkMarkers: every reaped generation has its marker (at that
// generation or a newer reaped one) unless its marker write failed, and a
// job whose row is FAILED by its reap has the marker of exactly that
// generation after the clean pass (which re-sets failed writes). A marker
// only ever holds a reaped generation.
func (r *raceRun) checkMarkers(ctx context.Context, l landedWrites) {
	reapedGens := map[string][]int64{}
	for ref := range l.byKind["reaped"] {
		reapedGens[ref.job] = append(reapedGens[ref.job], ref.gen)
	}
	for _, id := range r.ids {
		gen, found, err := r.s.markers.Get(ctx, id)
		if err != nil {
			r.rec.lockedViolate("reading the marker of %s: %v", id, err)
			continue
		}
		sn, err := r.s.store.Get(ctx, id)
		if err != nil {
			r.rec.lockedViolate("reading %s: %v", id, err)
			continue
		}
		gens := reapedGens[id]
		sort.Slice(gens, func(a, b int) bool { return gens[a] < gens[b] })
		r.rec.note(func() {
			if found && !contains(gens, gen) {
				r.rec.violate("the marker of %s holds generation %d, which was never reaped (reaped: %v)", id, gen, gens)
			}
			for _, g := range gens {
				if (!found || gen < g) && !r.rec.markerWritesFailed[attemptRef{id, g}] {
					r.rec.violate("%s generation %d was reaped with Redis up but its marker is %v (found %v)", id, g, gen, found)
				}
			}
			reapedNow := sn.Status == jobs.StatusFailed && (sn.FailureReason == jobs.ReasonStalled || sn.FailureReason == jobs.ReasonLostTask)
			if reapedNow && (!found || gen != sn.Generation) {
				r.rec.violate("%s is FAILED (%s) at generation %d but after a clean pass its marker is %d (found %v)",
					id, sn.FailureReason, sn.Generation, gen, found)
			}
		})
	}
}

func contains(gens []int64, g int64) bool {
	for _, x := range gens {
		if x == g {
			return true
		}
	}
	return false
}

// brokenMarkerReader fails every read, as the guard sees Redis down.
type brokenMarkerReader struct{}

func (brokenMarkerReader) Get(context.Context, string) (int64, bool, error) {
	return 0, false, errRedisDown
}

// checkGuard delivers each ended job's task once more, through the real
// start guard with Redis up and with Redis down: the handler never runs, a
// reaped job is refused as reaped, a failed one as failed (both for good),
// a completed one acknowledged, and nothing is written.
func (r *raceRun) checkGuard(ctx context.Context) {
	for _, id := range r.ids {
		before, err := r.s.store.Get(ctx, id)
		if err != nil {
			r.rec.lockedViolate("reading %s: %v", id, err)
			continue
		}
		if before.Status != jobs.StatusFailed && before.Status != jobs.StatusCompleted {
			continue
		}
		for _, markers := range []queue.MarkerReader{r.s.markers, brokenMarkerReader{}} {
			ran := false
			g := queue.NewGuardForTest(r.s.store, markers, queue.WithWorker("redelivery"), queue.WithLogger(r.log))
			err := queue.Deliver(ctx, g, id, asynq.HandlerFunc(func(context.Context, *asynq.Task) error {
				ran = true
				return nil
			}))
			want := "acknowledged"
			ok := err == nil
			switch {
			case before.Status == jobs.StatusFailed && (before.FailureReason == jobs.ReasonStalled || before.FailureReason == jobs.ReasonLostTask):
				want, ok = "refused as reaped", errors.Is(err, asynq.SkipRetry) && errors.Is(err, queue.ErrJobReaped)
			case before.Status == jobs.StatusFailed:
				want, ok = "refused as failed", errors.Is(err, asynq.SkipRetry) && errors.Is(err, queue.ErrJobFailed)
			}
			if ran || !ok {
				r.rec.lockedViolate("a redelivery of %s (%s %s, generation %d, marker reader %T) ran the handler: %v, answered %v; want %s",
					id, before.Status, before.FailureReason, before.Generation, markers, ran, err, want)
			}
		}
		after, err := r.s.store.Get(ctx, id)
		if err != nil || after.Status != before.Status || after.Generation != before.Generation {
			r.rec.lockedViolate("a redelivery of %s changed it: %s generation %d, then %s generation %d (%v)",
				id, before.Status, before.Generation, after.Status, after.Generation, err)
		}
	}
}
