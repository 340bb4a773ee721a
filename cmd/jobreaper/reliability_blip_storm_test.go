package main

import (
	"os"
	"slices"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/jobreaper/jobreaper/internal/fleettest"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
)

// The blip suite of the reliability report (jobstest.Figure suite
// "blip"): the stall-storm hold and the outage grace against real
// processes, CI-sized by default and longer in `make reliability`.
const (
	blipSuite = "blip"
	// envStormJobs sets how many jobs hang at once in
	// TestReliabilityBlip_HungJobsAreHeldThenReapedTogether (default
	// stormJobsDefault; at least 20).
	envStormJobs     = "JOBREAPER_STORM_JOBS"
	stormJobsDefault = 200
	// stormHold is the hold's length there (--stall-storm-hold): room
	// for a takeover and another daemon's passes within it, 4x what they
	// take on a slow machine.
	stormHold = 20 * time.Second
)

// stormJobCount returns JOBREAPER_STORM_JOBS or stormJobsDefault.
func stormJobCount(t *testing.T) int {
	t.Helper()
	s := os.Getenv(envStormJobs)
	if s == "" {
		return stormJobsDefault
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 20 {
		t.Fatalf("%s=%q: want a whole number of jobs, at least 20", envStormJobs, s)
	}
	return n
}

// TestReliabilityBlip_HungJobsAreHeldThenReapedTogether is case B48's
// storm with real processes: 200 jobs (JOBREAPER_STORM_JOBS) whose
// handlers really hang, claimed at once by two worker processes in two
// queues, beside live jobs that heartbeat every 200 ms; the leader of
// their queue set starts once every hung job is past the stall timeout, so
// that its first pass judges them all (a pass that ran while they were
// crossing it would judge some alone: see
// TestCase_B48_ACutWhoseStallsStraddlePasses). It reaps none and holds
// both queues for 20 s (--stall-storm-hold). During the hold:
//
//   - a daemon of another queue set that covers one of the held queues,
//     with no storm limits of its own, holds that queue's jobs and reaps
//     the stalled jobs of its other queue;
//   - the leader is killed (SIGKILL); the follower of the same set takes
//     the leader lease and keeps the hold: it holds every hung job and
//     starts no hold of its own.
//
// When the hold ends, the follower's first pass reaps every hung job
// together, and no live one. Beside it, a daemon of a third queue holds its
// 20 hung jobs for 60 s, and `jobreaper release-hold` (the binary) ends
// that hold: its next pass reaps them at once. And 50 jobs of a fourth
// queue, whose handlers stop heartbeating one after another (one every
// 600 ms), are reaped as they stall, a few per pass, no hold.
//
// Figures: jobs held, reaped after the hold, live jobs reaped (must be
// 0), the time from the hold's end, and from the release, to the reap.
// Not parallel: its margins are in seconds.
func TestReliabilityBlip_HungJobsAreHeldThenReapedTogether(t *testing.T) {
	n := stormJobCount(t)
	db := jobstest.New(t)
	f := newBlipFleet(t, db)
	const qa, qb, qx, qr, qt = "storm-a", "storm-b", "storm-x", "storm-r", "trickle"
	hungA, hungB := jobIDs("J-a", n*3/4), jobIDs("J-b", n-n*3/4)
	hung := append(slices.Clone(hungA), hungB...)
	live, lone, released, trickle := jobIDs("J-live", max(1, n/10)), jobIDs("J-x", 3), jobIDs("J-r", 20), jobIDs("J-t", 50)
	queues := qa + "," + qb + "," + qx + "," + qr
	per := (n+len(live)+len(lone)+len(released))/2 + 10
	f.worker("w1", queues, per)
	f.worker("w2", queues, per)
	f.worker("w3", qt, len(trickle)+5)

	// The trickle: its daemon runs throughout.
	dT := f.daemon("the trickle daemon", qt)
	// One stops every 600 ms: with its last heartbeat up to 2.2 s before
	// it stops, and passes a loaded machine delays by a second or two, a
	// pass sees about 5 of them at most, half the 10 a storm needs.
	for i, id := range trickle {
		f.enqueue(qt, blipLive, []string{id}, blipJob{Kind: "heartbeat", HangAfter: (3*time.Second + time.Duration(i)*600*time.Millisecond).String()})
	}
	// The storm.
	f.enqueue(qa, blipLive, live, blipJob{Kind: "heartbeat"})
	f.enqueue(qa, blipLive, hungA, blipJob{Kind: "hang"})
	f.enqueue(qb, blipLive, hungB, blipJob{Kind: "hang"})
	f.enqueue(qx, blipLive, lone, blipJob{Kind: "hang"})
	f.enqueue(qr, blipLive, released, blipJob{Kind: "hang"})
	all := slices.Concat(hung, lone, released)
	fleettest.WaitFor(t, "every hung job is claimed", func() bool { return f.count(all, `status = 'PROCESSING'`) == len(all) })
	f.waitLive(live)
	fleettest.WaitFor(t, "every hung job is past the stall timeout", func() bool {
		return f.count(all, `now() - updated_at > $2 * interval '1 second'`, (blipStall+time.Second).Seconds()) == len(all)
	})

	leader := f.daemon("the leader", qa+","+qb, "--stall-storm-hold", stormHold.String())
	dR := f.daemon("the daemon of "+qr, qr, "--stall-storm-hold", "60s")
	var hold holdRow
	fleettest.WaitFor(t, "the leader holds "+qa+" and "+qb, func() bool {
		var ok bool
		hold, ok = f.holdOn(qa)
		return ok || f.reapedStalled(hung) > 0
	})
	if f.reapedStalled(hung) != 0 || hold.Held != n || hold.Judged != n+len(live) || hold.Until.Sub(hold.StartedAt) != stormHold {
		t.Fatalf("hold %+v, %d hung jobs reaped; want the %d held of %d judged, none reaped, for %s",
			hold, f.reapedStalled(hung), n, n+len(live), stormHold)
	}
	if h, _ := f.holdOn(qb); h.ID != hold.ID {
		t.Fatalf("the hold of %s is %d, not the leader's %d", qb, h.ID, hold.ID)
	}
	jobstest.Figure(t, blipSuite, "storm_jobs_held", hold.Held)
	t.Logf("hold %d: %s, from %s to %s", hold.ID, hold.Tripped, hold.StartedAt.Format(time.StampMilli), hold.Until.Format(time.StampMilli))

	// Another queue set covering qb honours the hold and reaps qx.
	other := f.daemon("the daemon of "+qb+" and "+qx, qb+","+qx, "--max-stalled-per-pass", "0", "--max-stalled-fraction", "0")
	fleettest.WaitFor(t, "the other set's daemon reaps "+qx, func() bool { return f.reapedStalled(lone) == len(lone) })
	fleettest.WaitFor(t, "the other set's daemon holds "+qb, func() bool {
		return other.Metric("jobreaper_stall_storm_held") == float64(len(hungB))
	})
	// It stops before the hold ends, so that the reap after it is the
	// leader's, in one pass.
	if code := other.Stop(t); code != 0 {
		t.Fatalf("%s's exit after SIGTERM: %d", other.Name, code)
	}

	// The leader dies; the follower takes over and keeps the hold.
	follower := f.daemon("the follower", qa+","+qb, "--stall-storm-hold", stormHold.String())
	fleettest.WaitFor(t, "the follower runs as a follower", func() bool { return follower.Metric("jobreaper_leader") == 0 })
	leader.Signal(t, syscall.SIGKILL)
	leader.Wait(t)
	fleettest.WaitFor(t, "the follower takes the leader lease", follower.Leads)
	waitMetric(t, follower, float64(n), "jobreaper_stall_storm_held")
	if started := follower.Metric("jobreaper_stall_storms_total"); started != 0 {
		t.Fatalf("the new leader started %v holds, want none: it keeps hold %d", started, hold.ID)
	}
	now := f.now()
	if !now.Before(hold.Until) {
		t.Fatalf("the takeover and the other set's passes ended at %s, after the hold's end at %s: too slow to show them within it",
			now, hold.Until)
	}
	t.Logf("the other set's passes and the takeover were over %s before the hold's end", hold.Until.Sub(now).Round(time.Millisecond))
	if f.reapedStalled(hung) != 0 || len(f.changed(live)) != 0 {
		t.Fatalf("during the hold: %d hung jobs reaped, live jobs changed: %v", f.reapedStalled(hung), f.changed(live))
	}

	// The release of the other hold, meanwhile.
	var relHold holdRow
	fleettest.WaitFor(t, "the daemon of "+qr+" holds it", func() bool {
		var ok bool
		relHold, ok = f.holdOn(qr)
		return ok || f.reapedStalled(released) > 0
	})
	if relHold.Held != len(released) || f.reapedStalled(released) != 0 {
		t.Fatalf("hold of %s %+v, %d reaped; want its %d held", qr, relHold, f.reapedStalled(released), len(released))
	}
	r := fleettest.Run(t, f.bin, "", nil, "release-hold", "--database-url", db.URL, "--schema", db.Schema, "--queues", qr,
		"--reason", "these jobs hang for real")
	if r.Code != exitOK {
		t.Fatalf("release-hold: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
	releasedAt := f.now()
	fleettest.WaitFor(t, "the released jobs are reaped", func() bool { return f.reapedStalled(released) == len(released) })
	relReap, _ := f.reapedEvidence(released[0])
	if p := f.reapPasses(released); len(p) != 1 || !relReap.Before(relHold.Until) {
		t.Fatalf("the released jobs were reaped in passes of %v, at %s; want one pass before the hold would have ended at %s",
			p, relReap, relHold.Until)
	}
	jobstest.Figure(t, blipSuite, "release_to_reap_max_ms", relReap.Sub(releasedAt).Milliseconds())
	t.Logf("release-hold at %s; the %d jobs reaped %s later", releasedAt.Format(time.StampMilli), len(released), relReap.Sub(releasedAt))
	waitMetric(t, dR, float64(len(released)), "jobreaper_jobs_reaped_total")

	// The hold ends: the new leader reaps every hung job together.
	fleettest.WaitFor(t, "the hung jobs are reaped after the hold", func() bool { return f.reapedStalled(hung) == n })
	reapedAt, _ := f.reapedEvidence(hung[0])
	if p := f.reapPasses(hung); len(p) != 1 || reapedAt.Before(hold.Until) {
		t.Fatalf("the hung jobs were reaped in passes of %v, at %s; want one pass, at or after the hold's end %s", p, reapedAt, hold.Until)
	}
	waitMetric(t, follower, float64(len(hung)), "jobreaper_jobs_reaped_total")
	liveReaped := len(f.changed(live))
	jobstest.Figure(t, blipSuite, "storm_jobs_reaped_after_hold", f.reapedStalled(hung))
	jobstest.Figure(t, blipSuite, "live_reaped", liveReaped)
	jobstest.Figure(t, blipSuite, "hold_end_to_reap_max_ms", reapedAt.Sub(hold.Until).Milliseconds())
	t.Logf("the %d hung jobs reaped in one pass %s after the hold's end", n, reapedAt.Sub(hold.Until))
	f.requireNoneReaped("the storm's live jobs", live)

	// The trickle: reaped a few per pass, never held.
	fleettest.WaitFor(t, "the trickle's 50 jobs are reaped", func() bool { return f.reapedStalled(trickle) == len(trickle) })
	p := f.reapPasses(trickle)
	if _, ok := f.holdOn(qt); ok || slices.Max(p) >= 10 || dT.Metric("jobreaper_stall_storms_total") != 0 {
		t.Fatalf("the trickle was reaped in passes of %v (hold: %v); want fewer than 10 a pass and no hold", p, ok)
	}
	t.Logf("the trickle's 50 jobs were reaped in %d passes of %v", len(p), p)
	if n := f.tell("finish all"); n != len(live) {
		t.Fatalf("finish all reached %d handlers, want the %d live ones", n, len(live))
	}
	fleettest.WaitFor(t, "the live jobs complete", func() bool { return f.count(live, `status = 'COMPLETED'`) == len(live) })
}
