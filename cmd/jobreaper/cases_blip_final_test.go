package main

import (
	"fmt"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/jobreaper/jobreaper/internal/fleettest"
	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
)

// TestCase_B49_AFinalizationWriteMeetsATwoSecondBlip: a worker process
// runs five handlers through the real guard, each waiting until told to
// end; its PostgreSQL relay is cut, the five are told to end, and the
// relay comes back 2 s later. While PostgreSQL is away they return: an
// error on the last attempt (the fail kind, code upstream_down), an error
// with retries left (the error kind; the retry completes), a
// CompleteWith that cannot connect (the complete kind), nil on an
// auto_complete type (the nil kind), nil after a completion confirmed
// before the cut (the completed kind). Each job ends as its handler said:
// FAILED upstream_down; released (QUEUED), retried and COMPLETED by its
// second attempt; COMPLETED by the retried completion; auto-completed;
// COMPLETED. None is left PROCESSING, so no reap (stalled or lost_task)
// can ever touch them, the guard records no late result, and no handler
// whose job completed runs again. (queue's in-process test of the case
// also reads the guard's decision counts.)
func TestCase_B49_AFinalizationWriteMeetsATwoSecondBlip(t *testing.T) {
	db := jobstest.New(t)
	f := newBlipFleet(t, db)
	// Types whose max_runtime no handler here comes near: nothing but the
	// handlers' outcomes may end these jobs.
	db.JobType(t, "b49.plain", "30 minutes", "", "")
	db.JobType(t, "b49.auto", "30 minutes", "", "")
	db.Exec(t, `UPDATE `+db.Table("job_types")+` SET auto_complete = true WHERE name = 'b49.auto'`)
	const q = "b49"
	w := f.worker("w1", q, 5, "--retry-delay", "100ms")
	jobsOf := []struct {
		id, typ  string
		job      blipJob
		maxRetry int
	}{
		{"last", "b49.plain", blipJob{Kind: "fail", Code: "upstream_down", Wait: true}, 0},
		{"retry", "b49.plain", blipJob{Kind: "error", Wait: true, RetryKind: "complete"}, 3},
		{"complete", "b49.plain", blipJob{Kind: "complete", Wait: true}, 3},
		{"auto", "b49.auto", blipJob{Kind: "nil", Wait: true}, 3},
		{"done", "b49.plain", blipJob{Kind: "completed", Wait: true}, 3},
	}
	for _, j := range jobsOf {
		f.enqueue(q, j.typ, []string{j.id}, j.job, asynq.MaxRetry(j.maxRetry))
	}
	for _, j := range jobsOf {
		w.Await(t, fmt.Sprintf("waiting %s generation 1", j.id))
	}
	if row := db.Read(t, "done"); row.Status != jobs.StatusCompleted {
		t.Fatalf("done = %+v before the cut, want COMPLETED", row)
	}

	// The blip: every handler returns while the worker's PostgreSQL is
	// away; it comes back 2 s later.
	w.PG.Cut()
	cutAt := time.Now()
	if n := w.Tell(t, "go all"); n != len(jobsOf) {
		t.Fatalf("go all reached %d handlers, want %d", n, len(jobsOf))
	}
	sleepFor(t.Context(), 2*time.Second)
	back := f.now()
	w.PG.Restore()

	want := map[string]struct{ status, reason string }{
		"last": {jobs.StatusFailed, "upstream_down"}, "retry": {jobs.StatusCompleted, ""},
		"complete": {jobs.StatusCompleted, ""}, "auto": {jobs.StatusCompleted, ""}, "done": {jobs.StatusCompleted, ""},
	}
	insp := asynq.NewInspectorFromRedisClient(f.redis.Client(t))
	fleettest.WaitFor(t, "every job ends as its handler said and asynq holds no task of the queue", func() bool {
		for id, st := range want {
			if r := db.Read(t, id); r.Status != st.status || r.FailureReason != st.reason {
				return false
			}
		}
		qi, err := insp.GetQueueInfo(q)
		return err == nil && qi.Pending+qi.Active+qi.Scheduled+qi.Retry == 0
	})
	t.Logf("every job ended as its handler said %s after the cut began", time.Since(cutAt).Round(time.Millisecond))
	// Every handler returned while PostgreSQL was away (the complete
	// kind's CompleteWith included, which was still retrying); the writes
	// of their outcomes landed once it was back: each met the blip.
	if n := db.Count(t, `SELECT count(*) FROM `+db.Table("job_events")+` WHERE generation = 1 AND at > $1 AND (job_id, kind) IN
    (('last', 'failed'), ('retry', 'released'), ('complete', 'completed'), ('auto', 'completed'))`, back); n != 4 {
		t.Fatalf("%d of the 4 outcome writes of the handlers that returned during the cut landed after it, want 4", n)
	}
	if w.Count("start ") != 6 || w.Count("start retry ") != 2 {
		t.Fatalf("the worker started %d handlers (%d of retry); want 6: each job once, retry twice:\n%v",
			w.Count("start "), w.Count("start retry "), w.Said())
	}
	w.Await(t, "start retry generation 2 kind complete")
	w.Await(t, "completed retry generation 2")
	for _, c := range []struct {
		what string
		sql  string
	}{
		{"the retry job's first attempt released", `job_id = 'retry' AND kind = 'released' AND generation = 1`},
		{"the retry job completed by its second attempt", `job_id = 'retry' AND kind = 'completed' AND generation = 2`},
		{"the auto job auto-completed", `job_id = 'auto' AND kind = 'completed' AND detail->>'auto_complete' = 'true'`},
		{"the last job failed with its handler's code", `job_id = 'last' AND kind = 'failed' AND detail->>'code' = 'upstream_down'`},
	} {
		if n := db.Count(t, `SELECT count(*) FROM `+db.Table("job_events")+` WHERE `+c.sql); n != 1 {
			t.Errorf("%s: %d events, want 1", c.what, n)
		}
	}
	if n := db.Count(t, `SELECT count(*) FROM `+db.Table("job_events")+` WHERE kind IN ('late_result_rejected', 'reaped')`); n != 0 {
		t.Fatalf("%d late_result_rejected or reaped events, want none", n)
	}
}
