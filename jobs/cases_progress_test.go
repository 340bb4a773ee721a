package jobs_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jobreaper/jobreaper/internal/pgcore"
	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
)

// requireIdleUnder fails the test unless job id's updated_at is less than d
// before the database's now().
func requireIdleUnder(t *testing.T, db *jobstest.DB, id string, d time.Duration) {
	t.Helper()
	requireCount(t, db, 1, `SELECT count(*) FROM jobs WHERE id = $1 AND now() - updated_at < $2::interval`, id, pgcore.Interval(d))
}

func TestCase_B12_ProgressKeepsAJobPastItsLimitFromBeingReaped(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, store := setup(t, nil)
	db.Exec(t, jobstest.ItemsTable)
	countWrites(t, db)
	// J12 started at 08:00; the handler commits a batch and reports
	// progress every 2 minutes. The scan comes at 11:00.
	lease := queued(t, db, store, jobstest.Job{ID: "J12", Type: "crawl.site", Total: ptr[int64](1000)}, "W1")
	// J12b started alongside but stopped committing 16 minutes ago: the same
	// scan must reap it, which shows the scan is a real one.
	db.Insert(t, jobstest.Job{ID: "J12b", Type: "crawl.site", Generation: 1, Worker: "W1",
		StartedAgo: jobstest.Ago(180 * time.Minute), IdleAgo: 16 * time.Minute})
	hb, clock := heartbeater(t, store)
	var sent []int
	for i := range 10 {
		// Two minutes pass since the last write of any kind.
		db.Exec(t, `UPDATE jobs SET started_at = now() - interval '180 minutes' + $2::interval,
       updated_at = now() - interval '2 minutes' WHERE id = $1`, "J12", pgcore.Interval(time.Duration(i-9)*2*time.Minute))
		_, err := jobstest.Batch(ctx, store, db, lease, fmt.Sprintf("b%d", i), int64(i*10), 10)
		requireNoErr(t, err)
		requireIdleUnder(t, db, "J12", 5*time.Second) // every committed batch moved updated_at
		res, err := hb.Heartbeat(ctx, lease, int64(i*10+10))
		requireNoErr(t, err)
		if res.Sent {
			sent = append(sent, i*2)
		}
		clock.Advance(2 * time.Minute)
	}
	// Heartbeats passed the limiter at minutes 0, 6, 12, 18: at most one per 5 min.
	if fmt.Sprint(sent) != "[0 6 12 18]" {
		t.Fatalf("heartbeats sent at minutes %v, want [0 6 12 18]", sent)
	}
	if n := writes(t, db, "J12"); n != 4 {
		t.Fatalf("heartbeat writes = %d, want 4", n)
	}

	// 11:00: runtime 180 > 60, but updated_at is at most 5 minutes old.
	requireIdleUnder(t, db, "J12", 5*time.Minute)
	if reap(t, store, "J12") {
		t.Fatal("J12 was reaped while committing batches")
	}
	if !reap(t, store, "J12b") {
		t.Fatal("J12b, idle 16 min, was not reaped by the same scan")
	}
	if r := requireRow(t, db, "J12", jobs.StatusProcessing, 1, 100); r.FailureReason != "" {
		t.Fatalf("failure reason = %q", r.FailureReason)
	}
	if n := db.Events(t, "J12", "reaped"); n != 0 {
		t.Fatalf("J12 reaped events = %d", n)
	}
}

func TestCase_B13_HeartbeatWithoutProgressDoesNotKeepAHungJobAlive(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, store := setup(t, nil)
	countWrites(t, db)
	lease := queued(t, db, store, jobstest.Job{ID: "J13", Type: "report.export"}, "W1")
	hb, clock := heartbeater(t, store)
	_, err := hb.Heartbeat(ctx, lease, 7) // 09:05: the last real batch, mark 7
	requireNoErr(t, err)
	// scanAt places the row as seen at 09:mm: started 09:00, last progress 09:05.
	scanAt := func(minute int) {
		backdate(t, db, "J13", time.Duration(minute)*time.Minute, time.Duration(minute-5)*time.Minute)
	}

	// The deadlocked handler's ticker keeps sending mark 7 every 5 minutes.
	tick := func() {
		clock.Advance(5 * time.Minute)
		before := db.Read(t, "J13").UpdatedAt
		res, err := hb.Heartbeat(ctx, lease, 7)
		requireNoErr(t, err)
		if !res.Sent || res.Written {
			t.Fatalf("ticker heartbeat = %+v, want sent, not written", res)
		}
		if after := db.Read(t, "J13").UpdatedAt; !after.Equal(before) {
			t.Fatalf("a heartbeat without progress moved updated_at from %v to %v", before, after)
		}
	}
	scanAt(29)
	for range 4 { // 09:10 .. 09:25
		tick()
	}
	if reap(t, store, "J13") {
		t.Fatal("J13 reaped at 09:29, within its 30-minute limit")
	}
	scanAt(31)
	tick() // 09:30
	if !reap(t, store, "J13") {
		t.Fatal("J13 not reaped at 09:31, the first scan after 09:30 (runtime 31 > 30, idle 26 > 15)")
	}
	scanAt(45)
	if reap(t, store, "J13") {
		t.Fatal("J13 reaped twice")
	}
	if r := requireRow(t, db, "J13", jobs.StatusFailed, 1, 0); r.FailureReason != jobs.ReasonStalled {
		t.Fatalf("failure reason = %q", r.FailureReason)
	}
	if n := db.Events(t, "J13", "reaped"); n != 1 {
		t.Fatalf("FAILED writes (reaped events) = %d, want 1", n)
	}
	if n := writes(t, db, "J13"); n != 1 {
		t.Fatalf("heartbeat writes = %d, want only the first (mark 7)", n)
	}
}

func TestCase_B14_ThrottledHeartbeatsDoNotLoseCommittedProgress(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, store := setup(t, nil)
	db.Exec(t, jobstest.ItemsTable)
	countWrites(t, db)
	w1 := queued(t, db, store, jobstest.Job{ID: "J14", Type: "crawl.site", Total: ptr[int64](2000)}, "W1")
	hb, clock := heartbeater(t, store)
	clock.Advance(5 * time.Second)
	for b := int64(1); b <= 9; b++ { // 10:00 .. 10:04:30, one batch of 100 every 30 s
		_, err := jobstest.Batch(ctx, store, db, w1, fmt.Sprintf("batch-%d", b), (b-1)*100, 100)
		requireNoErr(t, err)
		_, err = hb.Heartbeat(ctx, w1, b*100)
		requireNoErr(t, err)
		clock.Advance(30 * time.Second)
	}
	if st := hb.Stats(); st.Written != 1 || writes(t, db, "J14") != 1 {
		t.Fatalf("heartbeat writes = %d (stats %+v), want 1 (10:00:05)", writes(t, db, "J14"), st)
	}
	requireRow(t, db, "J14", jobs.StatusProcessing, 1, 900)

	// 10:04:40 W1 crashes; asynq recovers the task and W2 claims it.
	w2 := claim(t, store, "J14", 1, "W2")
	if w2.Generation != 2 || w2.Cursor != 900 || w2.Total != 2000 {
		t.Fatalf("W2's lease = %+v, want generation 2 at cursor 900 of 2000", w2)
	}
	for b := int64(1); b <= 9; b++ {
		res, err := jobstest.Batch(ctx, store, db, w2, fmt.Sprintf("batch-%d", b), (b-1)*100, 100)
		requireNoErr(t, err)
		if !res.Replayed || res.Cursor != b*100 || res.Generation != 1 {
			t.Fatalf("re-sent batch-%d = %+v", b, res)
		}
		requireRow(t, db, "J14", jobs.StatusProcessing, 2, 900) // never backwards
	}
	res, err := jobstest.Batch(ctx, store, db, w2, "batch-10", 900, 100)
	requireNoErr(t, err)
	if res.Replayed || res.Cursor != 1000 {
		t.Fatalf("batch-10 = %+v", res)
	}
	requireItems(t, db, "J14", 1000)
	requireCount(t, db, 900, `SELECT count(*) FROM items WHERE job_id = 'J14' AND generation = 1`)
	requireBatches(t, db, "J14", 10)
	requireCount(t, db, 0, `SELECT count(*) FROM (
  SELECT cursor_after < lag(cursor_after) OVER (ORDER BY at, cursor_after) AS back FROM job_batches WHERE job_id = 'J14') x
 WHERE back`)
}

func TestCase_B18_ShutdownDuringALongJob(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, store := setup(t, nil)
	db.Exec(t, jobstest.ItemsTable)
	w1 := queued(t, db, store, jobstest.Job{ID: "J18", Type: "report.export", Total: ptr[int64](10)}, "W1")
	w1hb, w1clock := heartbeater(t, store)
	for i := int64(0); i < 3; i++ {
		_, err := jobstest.Batch(ctx, store, db, w1, fmt.Sprintf("b%d", i+1), i, 1)
		requireNoErr(t, err)
	}
	_, err := w1hb.Heartbeat(ctx, w1, 3)
	requireNoErr(t, err)
	// 10:13 SIGTERM; asynq requeues T18 after its ShutdownTimeout while W1's
	// handler goroutine runs on. 10:14: W3 claims generation 2.
	backdate(t, db, "J18", 14*time.Minute, time.Minute)
	w3 := claim(t, store, "J18", 1, "W3")
	if w3.Generation != 2 || w3.Cursor != 3 {
		t.Fatalf("W3's lease = %+v, want generation 2 at cursor 3", w3)
	}
	claimed := db.Read(t, "J18")

	// Everything W1's handler writes afterwards names generation 1.
	w1clock.Advance(jobs.HeartbeatIntervalDefault)
	_, err = jobstest.Batch(ctx, store, db, w1, "b4", 3, 1)
	requireIs(t, err, jobs.ErrStaleWorker)
	_, err = w1hb.Heartbeat(ctx, w1, 4)
	requireIs(t, err, jobs.ErrStaleWorker)
	requireIs(t, store.SetTotal(ctx, w1, 20), jobs.ErrStaleWorker)
	requireIs(t, store.Release(ctx, w1), jobs.ErrStaleWorker)
	_, err = store.CompleteWith(ctx, db.Pool, w1, nil)
	requireIs(t, err, jobs.ErrStaleWorker)
	requireIs(t, store.Fail(ctx, w1, "shutdown"), jobs.ErrStaleWorker)
	r := requireRow(t, db, "J18", jobs.StatusProcessing, 2, 3)
	if !r.UpdatedAt.Equal(claimed.UpdatedAt) || r.Total != 10 || r.Worker != "W3" {
		t.Fatalf("W1 changed the row: %+v, after the claim %+v", r, claimed)
	}
	if n := len(db.LateResults(t, "J18")); n != 6 {
		t.Fatalf("late_result_rejected events = %d, want 6", n)
	}

	// The claim made started_at and updated_at fresh: no reap.
	if reap(t, store, "J18") {
		t.Fatal("J18 reaped because of the shutdown")
	}
	res, err := jobstest.Batch(ctx, store, db, w3, "b4", 3, 1)
	requireNoErr(t, err)
	if res.Cursor != 4 || res.Replayed {
		t.Fatalf("W3's batch = %+v", res)
	}
	requireItems(t, db, "J18", 4)
}
