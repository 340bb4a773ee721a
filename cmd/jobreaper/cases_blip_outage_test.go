package main

import (
	"fmt"
	"testing"
	"time"

	"github.com/jobreaper/jobreaper/internal/fleettest"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
)

// outageRow reads the fleet's recorded outage end and its cause.
func (f *blipFleet) outageRow() (end time.Time, cause string) {
	f.t.Helper()
	if err := f.db.Pool.QueryRow(f.t.Context(), `SELECT outage_end, cause FROM `+f.db.Table("reaper_outages")).Scan(&end, &cause); err != nil {
		f.t.Fatalf("reading the outage row: %v", err)
	}
	return end, cause
}

// reapedEvidence reads the db_now and outage_end of job id's reaped event
// (outage_end zero when the evidence has none).
func (f *blipFleet) reapedEvidence(id string) (dbNow, outageEnd time.Time) {
	f.t.Helper()
	var end *time.Time
	if err := f.db.Pool.QueryRow(f.t.Context(), `SELECT (detail->>'db_now')::timestamptz, (detail->>'outage_end')::timestamptz FROM `+
		f.db.Table("job_events")+` WHERE job_id = $1 AND kind = 'reaped'`, id).Scan(&dbNow, &end); err != nil {
		f.t.Fatalf("reading the reaped event of %s: %v", id, err)
	}
	if end != nil {
		outageEnd = *end
	}
	return dbNow, outageEnd
}

// graceHeld is a daemon's count of jobs its passes held as outage_grace.
func graceHeld(d *fleettest.Daemon) float64 {
	return d.Metric("jobreaper_jobs_skipped_total", `reason="outage_grace"`)
}

// TestCase_B47_ASharedOutage: PostgreSQL is unreachable for every worker
// and every daemon at once (each process's relay cut) for the stall
// timeout plus one heartbeat interval, then comes back in the worst order:
// the daemons' relays first, the workers' only once every daemon has run a
// clean pass after it, a pass that sees every live job idle for longer
// than the stall timeout before any heartbeat could land. Three worker
// processes run the jobs, each past max_runtime and heartbeating every
// 200 ms; three daemons, each of its own queue set:
//
//   - the daemon of 20 live jobs and one whose handler stopped
//     heartbeating just before the outage: its first pass after the outage
//     records the outage's end and holds all 21 as outage_grace; none of
//     the 20 is ever reaped; the stalled one is reaped once the grace is
//     over, its reaped event naming the outage end, at least one stall
//     timeout after it;
//   - the daemon of 5 live jobs: too few for a stall storm (under 10), so
//     the outage grace alone keeps them: 0 reaped;
//   - the control, a daemon with the outage grace off (--outage-grace=false)
//     of 5 other live jobs: its first pass after the outage reaps all 5.
//
// Not parallel: its margins are in seconds.
func TestCase_B47_ASharedOutage(t *testing.T) {
	db := jobstest.New(t)
	f := newBlipFleet(t, db)
	const q20, q5, qOff = "b47-20", "b47-5", "b47-off"
	live20, live5, off := jobIDs("J-live", 20), jobIDs("J-five", 5), jobIDs("J-off", 5)
	const hung = "J-hung"
	queues := q20 + "," + q5 + "," + qOff
	ws := []*fleettest.Worker{f.worker("w1", queues, 15), f.worker("w2", queues, 15), f.worker("w3", queues, 15)}
	f.enqueue(q20, blipLive, append(append([]string{}, live20...), hung), blipJob{Kind: "heartbeat"})
	f.enqueue(q5, blipLive, live5, blipJob{Kind: "heartbeat"})
	f.enqueue(qOff, blipLive, off, blipJob{Kind: "heartbeat"})
	live := append(append([]string{}, live20...), live5...)
	f.waitLive(append(append([]string{hung}, live...), off...))
	d20, d5 := f.daemon("the daemon of 20", q20), f.daemon("the daemon of 5", q5)
	dOff := f.daemon("the grace-off daemon", qOff, "--outage-grace=false")
	daemons := []*fleettest.Daemon{d20, d5, dOff}
	for _, d := range daemons {
		waitPasses(t, d, 0, 2)
	}
	f.requireNoneReaped("before the outage", append(append([]string{hung}, live...), off...))

	// The stalled one stops heartbeating; then the outage.
	if n := f.tell("hang " + hung); n != 1 {
		t.Fatalf("hang %s reached %d handlers, want 1", hung, n)
	}
	cutAt := f.now()
	for _, d := range daemons {
		d.PG.Cut()
	}
	cut(pgRelays(ws...)...)
	sleepFor(t.Context(), blipOutage)
	back := f.now()
	passes := make([]float64, len(daemons))
	for i, d := range daemons {
		passes[i] = okPasses(d)
		d.PG.Restore()
	}
	for i, d := range daemons {
		waitPasses(t, d, passes[i], 1)
	}
	restore(pgRelays(ws...)...)
	t.Logf("PostgreSQL cut for every process from %s to %s", cutAt.Format(time.StampMilli), back.Format(time.StampMilli))

	// The first pass after the outage: every job of the grace's daemons
	// held, the control's reaped.
	for _, g := range []struct {
		d *fleettest.Daemon
		n int
	}{{d20, len(live20) + 1}, {d5, len(live5)}} {
		fleettest.WaitFor(t, fmt.Sprintf("%s's pass after the outage holds its %d jobs as outage_grace", g.d.Name, g.n), func() bool {
			return graceHeld(g.d) >= float64(g.n)
		})
	}
	f.requireNoneReaped("the first passes after the outage", append([]string{hung}, live...))
	end, cause := f.outageRow()
	if cause != "connection_lost" || !end.After(back) {
		t.Fatalf("recorded outage end %s (%s), want connection_lost after PostgreSQL came back at %s", end, cause, back)
	}
	fleettest.WaitFor(t, "the grace-off daemon reaps its 5 live jobs", func() bool { return f.reapedStalled(off) == len(off) })
	t.Logf("the control: the grace-off daemon reaped its 5 live jobs in passes of %v", f.reapPasses(off))

	// The grace ends: the stalled job is reaped, no live one.
	fleettest.WaitFor(t, "the stalled job is reaped after the grace", func() bool { return f.reapedStalled([]string{hung}) == 1 })
	reapedAt, evidenceEnd := f.reapedEvidence(hung)
	if !evidenceEnd.Equal(end) || reapedAt.Sub(end) < blipStall {
		t.Fatalf("the stalled job's evidence: outage end %s, reaped at %s; want the outage end %s and a reap a stall timeout after it",
			evidenceEnd, reapedAt, end)
	}
	fleettest.WaitFor(t, "every live job heartbeats after the outage", func() bool { return f.count(live, `updated_at > $2`, back) == len(live) })
	fleettest.WaitFor(t, "the grace is over", func() bool { return f.now().After(end.Add(blipStall)) })
	for _, d := range []*fleettest.Daemon{d20, d5} {
		waitPasses(t, d, okPasses(d), 2)
	}
	f.requireNoneReaped("a shared outage", live)
	waitMetric(t, d20, 1, "jobreaper_jobs_reaped_total")
	t.Logf("held as outage_grace since the outage: %v by the daemon of 20, %v by the daemon of 5; the stalled job reaped %s after the outage end",
		graceHeld(d20), graceHeld(d5), reapedAt.Sub(end).Round(time.Millisecond))

	if n := f.tell("finish all"); n != len(live) {
		t.Fatalf("finish all reached %d handlers, want %d", n, len(live))
	}
	fleettest.WaitFor(t, fmt.Sprintf("the %d live jobs complete", len(live)), func() bool {
		return f.count(live, `status = 'COMPLETED'`) == len(live)
	})
}
