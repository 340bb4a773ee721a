package main

import (
	"syscall"
	"testing"
	"time"

	"github.com/jobreaper/jobreaper/internal/fleettest"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
)

// holdRow is the part of a reaper_holds row the blip tests read.
type holdRow struct {
	ID                int64
	Held, Judged      int
	Tripped           string
	StartedAt, Until  time.Time
	Released, Drained bool
}

// holdOn returns the latest hold that names q, and whether there is one.
func (f *blipFleet) holdOn(q string) (holdRow, bool) {
	f.t.Helper()
	var h holdRow
	err := f.db.Pool.QueryRow(f.t.Context(), `SELECT id, held, judged, tripped, started_at, until, released_at IS NOT NULL,
       drained_at IS NOT NULL FROM `+f.db.Table("reaper_holds")+` WHERE $1 = ANY(queues) ORDER BY id DESC LIMIT 1`, q).
		Scan(&h.ID, &h.Held, &h.Judged, &h.Tripped, &h.StartedAt, &h.Until, &h.Released, &h.Drained)
	if err != nil {
		return holdRow{}, false
	}
	return h, true
}

// lastBeats returns the earliest and the latest updated_at among ids.
func (f *blipFleet) lastBeats(ids []string) (first, last time.Time) {
	f.t.Helper()
	if err := f.db.Pool.QueryRow(f.t.Context(), `SELECT min(updated_at), max(updated_at) FROM `+f.db.Table("jobs")+` WHERE id = ANY($1)`,
		ids).Scan(&first, &last); err != nil {
		f.t.Fatal(err)
	}
	return first, last
}

// pauseWhileStalling stops d (SIGSTOP) from a heartbeat interval before
// the first of ids can cross the stall timeout until half a second after
// the last one has, reading their last progress now (their workers cut),
// so that d's next pass judges them all stalled at once. It returns at
// once; the pause runs on timers, and the test fails at its end when a
// signal could not be sent.
//
// Why: the hold this test checks is one started with every job stalled
// (held 20 of 20 judged). Without the pause a pass could run while only
// some of them had crossed the stall timeout: the storm check then counts
// the others as at risk, and holds them all the same, but the hold's row
// records fewer held (TestCase_B48_ACutWhoseStallsStraddlePasses is that
// case).
func (f *blipFleet) pauseWhileStalling(d *fleettest.Daemon, ids []string) {
	f.t.Helper()
	first, last := f.lastBeats(ids)
	now := f.now()
	stopIn, contIn := first.Add(blipStall-blipHeartbeat).Sub(now), last.Add(blipStall+500*time.Millisecond).Sub(now)
	if stopIn <= 0 {
		f.t.Fatalf("the first of %d jobs crosses the stall timeout at %s, too soon to pause %s before it (now %s)",
			len(ids), first.Add(blipStall), d.Name, now)
	}
	errs := make(chan error, 2)
	send := func(sig syscall.Signal) func() {
		return func() { errs <- syscall.Kill(d.Pid(), sig) }
	}
	stop, cont := time.AfterFunc(stopIn, send(syscall.SIGSTOP)), time.AfterFunc(contIn, send(syscall.SIGCONT))
	f.t.Cleanup(func() {
		stop.Stop()
		cont.Stop()
	})
	f.t.Logf("%s paused from %s to %s (database clock): the last heartbeats before the cut spread over %s",
		d.Name, now.Add(stopIn).Format(time.StampMilli), now.Add(contIn).Format(time.StampMilli), last.Sub(first))
	f.t.Cleanup(func() {
		for range 2 {
			select {
			case err := <-errs:
				if err != nil {
					f.t.Errorf("pausing %s: %v", d.Name, err)
				}
			default:
			}
		}
	})
}

// TestCase_B48_AWorkersOnlyCut: the workers lose PostgreSQL, the daemons
// do not. Three groups of live jobs past max_runtime, each heartbeating
// every 200 ms from worker processes, each group watched by a daemon of
// its own queue set, every worker's PostgreSQL relay cut at once:
//
//   - 20 of 20 live jobs whose workers are cut for 1.6 stall timeouts,
//     under a daemon with the default storm limits: every one goes idle
//     past the stall timeout, which no outage grace covers (the daemon
//     never lost PostgreSQL) and no heartbeat retry can outrun. The hold
//     alone saves them: 0 reaped, their heartbeats land again within the
//     hold, the first pass after it reaps none, and they complete.
//   - the same cut of 20 other live jobs under a daemon with the storm
//     limits off (--max-stalled-per-pass 0 --max-stalled-fraction 0): the
//     control: every one of them is reaped.
//   - 5 live jobs whose workers are cut for half the stall timeout, under
//     a daemon with the defaults: too few for a storm, no outage for the
//     grace; the Heartbeater retries the failed writes at once when
//     PostgreSQL is back, and they land before any job is idle for the
//     stall timeout: 0 reaped.
//
// Not parallel: its margins are in seconds.
func TestCase_B48_AWorkersOnlyCut(t *testing.T) {
	db := jobstest.New(t)
	f := newBlipFleet(t, db)
	const qHold, qOff, qShort = "b48-hold", "b48-off", "b48-short"
	held, off, short := jobIDs("J-hold", 20), jobIDs("J-off", 20), jobIDs("J-short", 5)
	long := []*fleettest.Worker{f.worker("w1", qHold+","+qOff, 25), f.worker("w2", qHold+","+qOff, 25)}
	shortW := f.worker("w3", qShort, 8)
	for _, g := range []struct {
		q   string
		ids []string
	}{{qHold, held}, {qOff, off}, {qShort, short}} {
		f.enqueue(g.q, blipLive, g.ids, blipJob{Kind: "heartbeat"})
	}
	all := append(append(append([]string{}, held...), off...), short...)
	f.waitLive(all)
	dHold := f.daemon("the daemon", qHold)
	dOff := f.daemon("the storm-off daemon", qOff, "--max-stalled-per-pass", "0", "--max-stalled-fraction", "0")
	dShort := f.daemon("the short-cut daemon", qShort)
	for _, d := range []*fleettest.Daemon{dHold, dOff, dShort} {
		waitPasses(t, d, 0, 2)
	}
	f.requireNoneReaped("before the cut", all)

	cutAt := time.Now()
	cut(pgRelays(append(long, shortW)...)...)
	sleepFor(t.Context(), 300*time.Millisecond) // a write in flight at the cut lands or fails
	f.pauseWhileStalling(dHold, held)

	// The short cut: PostgreSQL back for w3 after half the stall timeout.
	sleepFor(t.Context(), time.Until(cutAt.Add(blipStall/2)))
	shortBack := f.now()
	restore(shortW.PG)
	fleettest.WaitFor(t, "the 5 short-cut jobs heartbeat again", func() bool {
		return f.count(short, `updated_at > $2`, shortBack) == len(short)
	})
	_, landed := f.lastBeats(short)
	t.Logf("the 5 short-cut jobs heartbeated again within %s of PostgreSQL's return", landed.Sub(shortBack).Round(time.Millisecond))

	// The long cut: the storm, held.
	var hold holdRow
	fleettest.WaitFor(t, "the daemon holds "+qHold, func() bool {
		var ok bool
		hold, ok = f.holdOn(qHold)
		return ok || len(f.changed(held)) > 0
	})
	f.requireNoneReaped("the storm", held)
	if hold.Held != len(held) || hold.Judged != len(held) || hold.Until.Sub(hold.StartedAt) != blipStall {
		t.Fatalf("hold %+v; want the %d live jobs held of %d judged, for one stall timeout", hold, len(held), len(held))
	}
	t.Logf("hold %d: %s, from %s to %s", hold.ID, hold.Tripped, hold.StartedAt.Format(time.StampMilli), hold.Until.Format(time.StampMilli))
	sleepFor(t.Context(), time.Until(cutAt.Add(blipStall*16/10)))
	back := f.now()
	restore(pgRelays(long...)...)
	fleettest.WaitFor(t, "the 20 held jobs heartbeat again", func() bool { return f.count(held, `updated_at > $2`, back) == len(held) })
	if _, landed := f.lastBeats(held); !landed.Before(hold.Until) {
		t.Fatalf("the held jobs' heartbeats landed by %s, after the hold ended at %s", landed, hold.Until)
	}
	fleettest.WaitFor(t, "the first pass after the hold drains it", func() bool {
		h, _ := f.holdOn(qHold)
		return h.Drained
	})
	f.requireNoneReaped("after the hold", held)
	f.requireNoneReaped("the short cut", short)
	waitMetric(t, dHold, 1, "jobreaper_stall_storms_total")

	// The control: the same cut, no storm limits.
	fleettest.WaitFor(t, "the storm-off daemon reaps its 20 live jobs", func() bool { return f.reapedStalled(off) == len(off) })
	if _, ok := f.holdOn(qOff); ok {
		t.Fatalf("a hold names %s, whose daemon has no storm limits", qOff)
	}
	t.Logf("the storm-off daemon reaped its 20 live jobs in passes of %v", f.reapPasses(off))

	if n := f.tell("finish all"); n != len(held)+len(short) {
		t.Fatalf("finish all reached %d handlers, want %d", n, len(held)+len(short))
	}
	fleettest.WaitFor(t, "the held and short-cut jobs complete", func() bool {
		return f.count(append(append([]string{}, held...), short...), `status = 'COMPLETED'`) == len(held)+len(short)
	})
}

// TestCase_B48_ACutWhoseStallsStraddlePasses: 20 live jobs whose claims,
// and so whose heartbeats, are spread over one heartbeat interval (one
// every 110 ms), as the heartbeats of a fleet that has run for a while
// are; their workers lose PostgreSQL for 1.6 stall timeouts while the
// daemon, with the default storm limits, keeps it. B48 says 0 of them
// may be reaped.
func TestCase_B48_ACutWhoseStallsStraddlePasses(t *testing.T) {
	db := jobstest.New(t)
	f := newBlipFleet(t, db)
	const q = "b48-spread"
	live := jobIDs("J-spread", 20)
	ws := []*fleettest.Worker{f.worker("w1", q, 25), f.worker("w2", q, 25)}
	for _, id := range live {
		f.enqueue(q, blipLive, []string{id}, blipJob{Kind: "heartbeat"})
		sleepFor(t.Context(), blipHeartbeat/time.Duration(len(live))+10*time.Millisecond) // the spread of the claims
	}
	f.waitLive(live)
	d := f.daemon("the daemon", q)
	waitPasses(t, d, 0, 2)
	cutAt := time.Now()
	cut(pgRelays(ws...)...)
	sleepFor(t.Context(), blipStall*16/10)
	restore(pgRelays(ws...)...)
	first, last := f.lastBeats(live)
	t.Logf("the last heartbeats before the cut at %s spread over %s", cutAt.Format(time.StampMilli), last.Sub(first))
	fleettest.WaitFor(t, "the live jobs that are left heartbeat again", func() bool {
		return f.count(live, `status <> 'PROCESSING' OR updated_at > now() - interval '1 second'`) == len(live)
	})
	t.Logf("reaped in passes of %v", f.reapPasses(live))
	f.requireNoneReaped("a cut whose stalls straddle passes", live)
}
