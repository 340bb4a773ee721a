package jobs_test

import (
	"context"
	"testing"
	"time"

	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
)

// TestCase_B34_SupersededAttemptDoesNotUseTheLiveAttemptsWindow: one worker
// process, one Heartbeater (5 min, on a fake clock). Attempt 1 of J34
// (generation 1) ignores its context after asynq's timeout and keeps
// calling Heartbeat every 10 s with an advancing mark; asynq retries the
// task in the same process at 2:00, where attempt 2 (generation 2) claims
// it and heartbeats every 10 s too. Over attempt 2's first 20 minutes it
// must be written at least 4 times, attempt 1 must be refused as stale, and
// a call on an already-cancelled context must use up no window.
func TestCase_B34_SupersededAttemptDoesNotUseTheLiveAttemptsWindow(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, store := setup(t, nil)
	countWrites(t, db)
	a1 := queued(t, db, store, jobstest.Job{ID: "J34", Type: "video.transcode"}, "W1")
	hb, clock := heartbeater(t, store)
	const every = 10 * time.Second

	var mark1, mark2 int64
	for range 12 { // 0:00 to 1:50: attempt 1 alone, written once at 0:00
		mark1++
		_, err := hb.Heartbeat(ctx, a1, mark1)
		requireNoErr(t, err)
		clock.Advance(every)
	}
	a2 := claim(t, store, "J34", 1, "W1") // 2:00, same process

	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	var staleAnswers int
	for step := 0; step <= 120; step++ { // 2:00 to 22:00, both attempts every 10 s
		if step == 30 { // 7:00, when attempt 2's second window opens
			res, err := hb.Heartbeat(cancelled, a2, mark2+1)
			requireIs(t, err, context.Canceled)
			if res.Sent || res.Throttled {
				t.Fatalf("heartbeat on a cancelled context = %+v, want nothing sent and nothing throttled", res)
			}
		}
		mark2++
		res, err := hb.Heartbeat(ctx, a2, mark2)
		requireNoErr(t, err)
		if step%30 == 0 && !res.Written {
			t.Fatalf("attempt 2's heartbeat at %s = %+v, want written (its window opened)", clock.Now().Sub(epoch), res)
		}
		mark1++
		_, err = hb.Heartbeat(ctx, a1, mark1)
		requireIs(t, err, jobs.ErrStaleWorker)
		staleAnswers++
		clock.Advance(every)
	}

	// Attempt 2: written at 2:00, 7:00 (after the cancelled call), 12:00,
	// 17:00 and 22:00; the case asks for at least 4 in 20 minutes.
	gen2 := db.Count(t, `SELECT count(*) FROM heartbeat_writes WHERE job_id = 'J34' AND generation = 2`)
	if gen2 < 4 || gen2 != 5 {
		t.Fatalf("heartbeat writes of generation 2 = %d, want 5 (at least 4 in 20 min)", gen2)
	}
	requireCount(t, db, 1, `SELECT count(*) FROM heartbeat_writes WHERE job_id = 'J34' AND generation = 1`)
	r := requireRow(t, db, "J34", jobs.StatusProcessing, 2, 0)
	if r.ProgressMark != 121 {
		t.Fatalf("progress mark = %d, want attempt 2's mark at 22:00 (121)", r.ProgressMark)
	}
	// Every call of attempt 1 after attempt 2 began was refused as stale;
	// PostgreSQL was asked at most once per interval (2:00, then 5:00,
	// 10:00, 15:00 and 20:00, as the refused attempt's entry expires), and
	// each of those left a late_result_rejected event.
	late := requireLate(t, db, "J34",
		[2]string{"Heartbeat", "stale_worker"}, [2]string{"Heartbeat", "stale_worker"}, [2]string{"Heartbeat", "stale_worker"},
		[2]string{"Heartbeat", "stale_worker"}, [2]string{"Heartbeat", "stale_worker"})
	for _, d := range late {
		if d.StaleGeneration != 1 || d.CurrentGeneration != 2 {
			t.Fatalf("late result = %+v, want generation 1 refused while 2 owns the job", d)
		}
	}
	st := hb.Stats()
	if staleAnswers != 121 || st.Refused != 121 || st.Failed != 1 {
		t.Fatalf("stats = %+v after %d stale answers, want 121 refused and 1 failed (the cancelled call)", st, staleAnswers)
	}
}

// State the Heartbeater keeps belongs to the attempt, not the job: besides
// the window (B34), the memory of a refusal. Attempt 1's refusal is
// answered to attempt 1's later calls without a round trip, and never to
// attempt 2's.
func TestHeartbeaterRemembersRefusalsPerAttempt(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, store := setup(t, nil)
	countWrites(t, db)
	a1 := queued(t, db, store, jobstest.Job{ID: "J", Type: "video.transcode"}, "W1")
	hb, clock := heartbeater(t, store)
	res, err := hb.Heartbeat(ctx, a1, 1)
	requireNoErr(t, err)
	if !res.Written {
		t.Fatalf("attempt 1's first heartbeat = %+v, want written", res)
	}
	a2 := claim(t, store, "J", 1, "W2") // attempt 2 runs in another process
	clock.Advance(jobs.HeartbeatIntervalDefault)

	_, err = hb.Heartbeat(ctx, a1, 2)
	requireIs(t, err, jobs.ErrStaleWorker)
	for i := range 3 { // remembered: no round trip, no second event
		clock.Advance(time.Minute)
		res, err := hb.Heartbeat(ctx, a1, int64(3+i))
		requireIs(t, err, jobs.ErrStaleWorker)
		if res.Sent || res.Throttled {
			t.Fatalf("later call of the refused attempt = %+v, want answered from memory", res)
		}
	}
	requireLate(t, db, "J", [2]string{"Heartbeat", "stale_worker"})

	// Attempt 2 moves to this process (asynq redelivers here): its calls
	// are its own, neither refused nor throttled by attempt 1's entry.
	res, err = hb.Heartbeat(ctx, a2, 1)
	requireNoErr(t, err)
	if !res.Written {
		t.Fatalf("attempt 2's heartbeat = %+v, want written", res)
	}
	requireCount(t, db, 1, `SELECT count(*) FROM heartbeat_writes WHERE job_id = 'J' AND generation = 2`)
	if n := hb.Tracked(); n != 2 {
		t.Fatalf("tracked attempts = %d, want 2 (one per generation)", n)
	}
	if st := hb.Stats(); st.Sent != 3 || st.Refused != 4 || st.Written != 2 {
		t.Fatalf("stats = %+v, want 3 sent, 4 refused, 2 written", st)
	}
}
