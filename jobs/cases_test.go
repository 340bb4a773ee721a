package jobs_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
)

// The jobs-side parts of CASES.md. Times of day in the cases are placed on
// the database clock relative to now(); the reaper's pass is Store.Reap
// with the evidence the reaper reads (it re-checks the whole rule in SQL).
// Markers, acks and retries are the queue package's part.

func requireParent(t *testing.T, db *jobstest.DB, id string, want jobstest.ParentState) {
	t.Helper()
	got, err := jobstest.ReadParent(context.Background(), db, id)
	requireNoErr(t, err)
	if got != want {
		t.Fatalf("parent %s = %+v, want %+v", id, got, want)
	}
}

func TestCase_B05_LateCompletionAfterReap(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, store := setup(t, jobstest.ParentCascades("report.export", true))
	db.Exec(t, jobstest.ParentSchema)
	db.Exec(t, `INSERT INTO parents (id, pending) VALUES ('P', 1)`)
	w1 := queued(t, db, store, jobstest.Job{ID: "J5", Type: "report.export", ParentID: "P"}, "W1")
	// Now is 09:31: W1 started at 09:00, last progress at 09:10.
	backdate(t, db, "J5", 31*time.Minute, 21*time.Minute)
	if !reap(t, store, "J5") {
		t.Fatal("J5 was not reaped at 09:31 (runtime 31 > 30, idle 21 > 15)")
	}

	// 09:33: W1 unblocks and completes: COMPLETED, parent READY, usage.
	_, err := jobstest.CompleteChild(ctx, store, db, w1)
	requireIs(t, err, jobs.ErrJobTerminal)
	if !strings.Contains(err.Error(), "FAILED (stalled)") {
		t.Fatalf("W1's error does not say the job was reaped: %v", err)
	}
	r := requireRow(t, db, "J5", jobs.StatusFailed, 1, 0)
	if r.FailureReason != jobs.ReasonStalled {
		t.Fatalf("failure reason = %q", r.FailureReason)
	}
	requireParent(t, db, "P", jobstest.ParentState{Status: "FAILED", Pending: 0, Completed: 0, Failed: 1})
	requireCount(t, db, 0, `SELECT count(*) FROM parent_events WHERE kind = 'ready'`)
	requireCount(t, db, 0, `SELECT count(*) FROM usage WHERE job_id = 'J5'`)
	requireCount(t, db, 1, `SELECT count(*) FROM job_events WHERE job_id = 'J5' AND kind = 'reaped'`)
	requireLate(t, db, "J5", [2]string{"Complete", "job_terminal"})
}

func TestCase_B06_StaleWorkerWritesAreRefused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, store := setup(t, nil)
	db.Exec(t, jobstest.ItemsTable)
	// W1 (generation 1) hangs inside the batch at cursor 380.
	w1 := queued(t, db, store, jobstest.Job{ID: "J6", Type: "crawl.site", Cursor: 380, Total: ptr[int64](1000)}, "W1")
	w1hb, w1clock := heartbeater(t, store)
	_, err := w1hb.Heartbeat(ctx, w1, 380)
	requireNoErr(t, err)

	// 10:25: asynq's timeout retried the task; W2 claims generation 2 and
	// resumes at 380, reaching 400 by 10:29.
	w2 := claim(t, store, "J6", 1, "W2")
	if w2.Generation != 2 || w2.Cursor != 380 {
		t.Fatalf("W2's lease = %+v", w2)
	}
	for _, from := range []int64{380, 390} {
		_, err := jobstest.Batch(ctx, store, db, w2, "batch-"+itoa(from/10+1), from, 10)
		requireNoErr(t, err)
	}
	w2hb, w2clock := heartbeater(t, store)
	_, err = w2hb.Heartbeat(ctx, w2, 400)
	requireNoErr(t, err)
	before := requireRow(t, db, "J6", jobs.StatusProcessing, 2, 400)

	// 10:30: W1 wakes up and writes everything it had.
	w1clock.Advance(30 * time.Minute)
	_, err = w1hb.Heartbeat(ctx, w1, 390)
	requireIs(t, err, jobs.ErrStaleWorker)
	_, err = jobstest.Batch(ctx, store, db, w1, "batch-39", 380, 10)
	requireIs(t, err, jobs.ErrStaleWorker)
	_, err = store.CompleteWith(ctx, db.Pool, w1, nil)
	requireIs(t, err, jobs.ErrStaleWorker)
	requireIs(t, store.Fail(ctx, w1, "crawl_failed"), jobs.ErrStaleWorker)

	after := requireRow(t, db, "J6", jobs.StatusProcessing, 2, 400)
	if after.FailureReason != "" || !after.UpdatedAt.Equal(before.UpdatedAt) || after.ProgressMark != 400 {
		t.Fatalf("the zombie changed the row: before %+v, after %+v", before, after)
	}
	requireItems(t, db, "J6", 20)
	for _, d := range requireLate(t, db, "J6",
		[2]string{"Heartbeat", "stale_worker"}, [2]string{"Advance", "stale_worker"},
		[2]string{"Complete", "stale_worker"}, [2]string{"Fail", "stale_worker"}) {
		if d.StaleGeneration != 1 || d.CurrentGeneration != 2 || d.FencingToken != "J6:1" {
			t.Fatalf("detail = %+v", d)
		}
	}

	// W2 goes on.
	res, err := jobstest.Batch(ctx, store, db, w2, "batch-41", 400, 10)
	requireNoErr(t, err)
	w2clock.Advance(jobs.HeartbeatIntervalDefault)
	hb, err := w2hb.Heartbeat(ctx, w2, 410)
	requireNoErr(t, err)
	if res.Cursor != 410 || !hb.Written {
		t.Fatalf("W2's next Advance = %+v, Heartbeat = %+v", res, hb)
	}
	requireRow(t, db, "J6", jobs.StatusProcessing, 2, 410)
}

func TestCase_B07_StallFailedChildDoesNotCompleteItsParent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	for _, policy := range []struct {
		name       string
		failParent bool
		afterReap  jobstest.ParentState
		atEnd      jobstest.ParentState
		endEvent   string
	}{
		{"FailParentPolicyFailsTheParentOnce", true, jobstest.ParentState{Status: "FAILED", Pending: 2, Completed: 0, Failed: 1}, jobstest.ParentState{Status: "FAILED", Pending: 0, Completed: 2, Failed: 1}, "failed"},
		{"ToleratePolicyWaitsForTheOtherChildren", false, jobstest.ParentState{Status: "WAITING_CHILDREN", Pending: 2, Completed: 0, Failed: 1}, jobstest.ParentState{Status: "PARTIAL", Pending: 0, Completed: 2, Failed: 1}, "partial"},
	} {
		t.Run(policy.name, func(t *testing.T) {
			t.Parallel()
			db, store := setup(t, jobstest.ParentCascades("video.transcode", policy.failParent))
			db.Exec(t, jobstest.ParentSchema)
			// P's children are reaped (C2) or failed by a worker (D2): one
			// domain transition, so P and Q must end alike.
			db.Exec(t, `INSERT INTO parents (id, pending) VALUES ('P', 3), ('Q', 3)`)
			leases := map[string]jobs.Lease{}
			for _, id := range []string{"C1", "C2", "C3", "D1", "D2", "D3"} {
				parent := map[byte]string{'C': "P", 'D': "Q"}[id[0]]
				leases[id] = queued(t, db, store, jobstest.Job{ID: id, Type: "video.transcode", ParentID: parent}, "W1")
			}
			// 14:01: C2 started 12:00, last progress 12:10, worker dead.
			backdate(t, db, "C2", 121*time.Minute, 111*time.Minute)
			if !reap(t, store, "C2") {
				t.Fatal("C2 was not reaped")
			}
			requireNoErr(t, store.Fail(ctx, leases["D2"], "render_failed"))
			requireParent(t, db, "P", policy.afterReap)
			requireParent(t, db, "Q", policy.afterReap)

			// A late completion of C2 changes nothing.
			_, err := jobstest.CompleteChild(ctx, store, db, leases["C2"])
			requireIs(t, err, jobs.ErrJobTerminal)
			for _, id := range []string{"C1", "C3", "D1", "D3"} {
				_, err := jobstest.CompleteChild(ctx, store, db, leases[id])
				requireNoErr(t, err)
			}
			requireParent(t, db, "P", policy.atEnd)
			requireParent(t, db, "Q", policy.atEnd)
			for _, p := range []string{"P", "Q"} {
				requireCount(t, db, 0, `SELECT count(*) FROM parent_events WHERE parent_id = $1 AND kind = 'ready'`, p)
				requireCount(t, db, 1, `SELECT count(*) FROM parent_events WHERE parent_id = $1 AND kind = $2`, p, policy.endEvent)
			}
			requireCount(t, db, 1, `SELECT count(*) FROM notifications WHERE job_id = 'C2'`)
			requireCount(t, db, 1, `SELECT count(*) FROM notifications WHERE job_id = 'D2'`)
			requireCount(t, db, 2, `SELECT count(*) FROM notifications`)
			requireCount(t, db, 0, `SELECT count(*) FROM usage WHERE job_id IN ('C2', 'D2')`)
			requireCount(t, db, 4, `SELECT count(*) FROM usage`)
		})
	}
}

func TestCase_B08_DoubleCompletionDoesNotDriveThePendingCountNegative(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, store := setup(t, jobstest.ParentCascades("report.export", true))
	db.Exec(t, jobstest.ParentSchema)
	db.Exec(t, `INSERT INTO parents (id, pending) VALUES ('P', 3)`)
	w1 := queued(t, db, store, jobstest.Job{ID: "C1", Type: "report.export", ParentID: "P"}, "W1")
	c2 := queued(t, db, store, jobstest.Job{ID: "C2", Type: "report.export", ParentID: "P"}, "W3")
	c3 := queued(t, db, store, jobstest.Job{ID: "C3", Type: "report.export", ParentID: "P"}, "W3")

	// C1 is redelivered; W2 runs it as generation 2 and completes at 10:50.
	w2 := claim(t, store, "C1", 1, "W2")
	_, err := jobstest.CompleteChild(ctx, store, db, w2)
	requireNoErr(t, err)
	requireParent(t, db, "P", jobstest.ParentState{Status: "WAITING_CHILDREN", Pending: 2, Completed: 1, Failed: 0})

	// 10:52: W1 (generation 1) completes too.
	_, err = jobstest.CompleteChild(ctx, store, db, w1)
	requireIs(t, err, jobs.ErrStaleWorker)
	requireParent(t, db, "P", jobstest.ParentState{Status: "WAITING_CHILDREN", Pending: 2, Completed: 1, Failed: 0})
	requireLate(t, db, "C1", [2]string{"Complete", "stale_worker"})

	for _, l := range []jobs.Lease{c2, c3} {
		_, err := jobstest.CompleteChild(ctx, store, db, l)
		requireNoErr(t, err)
	}
	requireParent(t, db, "P", jobstest.ParentState{Status: "READY", Pending: 0, Completed: 3, Failed: 0})

	// Replaying W2's completion (same child, same generation) is a no-op.
	res, err := jobstest.CompleteChild(ctx, store, db, w2)
	requireNoErr(t, err)
	if !res.Replayed {
		t.Fatalf("replay = %+v", res)
	}
	requireParent(t, db, "P", jobstest.ParentState{Status: "READY", Pending: 0, Completed: 3, Failed: 0})
	requireCount(t, db, 1, `SELECT count(*) FROM parent_events WHERE parent_id = 'P' AND kind = 'ready'`)
	requireCount(t, db, 1, `SELECT count(*) FROM usage WHERE job_id = 'C1'`)
	requireCount(t, db, 3, `SELECT count(*) FROM usage`)
	requireRow(t, db, "C1", jobs.StatusCompleted, 2, 0)
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }
