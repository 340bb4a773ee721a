package jobs_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
)

func TestCheckFailureCode(t *testing.T) {
	t.Parallel()
	for _, code := range []string{"upstream_timeout", "no_completion", "x", "quota_exceeded_2"} {
		if err := jobs.CheckFailureCode(code); err != nil {
			t.Errorf("%q refused: %v", code, err)
		}
	}
	for _, code := range []string{"", "Upstream_timeout", "upstream timeout", "dial tcp 10.0.0.1:443: i/o timeout",
		"a__b", "_a", "a_", "2fast", strings.Repeat("a", 65)} {
		if err := jobs.CheckFailureCode(code); err == nil {
			t.Errorf("%q accepted", code)
		} else {
			requireIs(t, err, jobs.ErrInvalidArgument)
		}
	}
}

func TestFail(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("FailStoresTheCodeAndRunsTheFailureCascadeOnce", func(t *testing.T) {
		t.Parallel()
		db, store := setup(t, recordingCascades)
		db.Exec(t, hookTable)
		lease := queued(t, db, store, jobstest.Job{ID: "j1", Type: "report.export"}, "w1")
		requireNoErr(t, store.Fail(ctx, lease, "upstream_timeout"))
		r := requireRow(t, db, "j1", jobs.StatusFailed, 1, 0)
		if r.FailureReason != "upstream_timeout" || !r.Finished {
			t.Fatalf("row = %+v", r)
		}
		requireHooks(t, db, "j1", "on_failed", 1)
		if n := db.Events(t, "j1", jobs.EventFailed); n != 1 {
			t.Fatalf("failed events = %d", n)
		}
		requireIs(t, store.Fail(ctx, lease, "upstream_timeout"), jobs.ErrJobTerminal)
		requireHooks(t, db, "j1", "on_failed", 1)
		requireLate(t, db, "j1", [2]string{"Fail", "job_terminal"})
	})

	t.Run("ErrorTextIsRefusedAndNothingIsWritten", func(t *testing.T) {
		t.Parallel()
		db, store := setup(t, recordingCascades)
		db.Exec(t, hookTable)
		lease := queued(t, db, store, jobstest.Job{ID: "j1", Type: "report.export"}, "w1")
		err := store.Fail(ctx, lease, `Post "https://api.example/v1?key=s3cret": context deadline exceeded`)
		requireIs(t, err, jobs.ErrInvalidArgument)
		if strings.Contains(err.Error(), "s3cret") {
			t.Fatalf("error repeats the secret: %v", err)
		}
		requireRow(t, db, "j1", jobs.StatusProcessing, 1, 0)
		requireHooks(t, db, "j1", "on_failed", 0)
	})

	t.Run("FailOfAnOldGenerationIsStaleAndLeavesTheNewAttempt", func(t *testing.T) {
		t.Parallel()
		db, store := setup(t, recordingCascades)
		db.Exec(t, hookTable)
		old := queued(t, db, store, jobstest.Job{ID: "j1", Type: "report.export"}, "w1")
		claim(t, store, "j1", 1, "w2")
		requireIs(t, store.Fail(ctx, old, "upstream_timeout"), jobs.ErrStaleWorker)
		if r := requireRow(t, db, "j1", jobs.StatusProcessing, 2, 0); r.FailureReason != "" {
			t.Fatalf("failure reason = %q", r.FailureReason)
		}
		requireHooks(t, db, "j1", "on_failed", 0)
		requireLate(t, db, "j1", [2]string{"Fail", "stale_worker"})
	})

	t.Run("AFailingCascadeWritesNothing", func(t *testing.T) {
		t.Parallel()
		db, store := setup(t, jobs.Cascades{"report.export": {OnFailed: []string{`UPDATE missing_table SET x = @job_id`}}})
		lease := queued(t, db, store, jobstest.Job{ID: "j1", Type: "report.export"}, "w1")
		err := store.Fail(ctx, lease, "upstream_timeout")
		if err == nil || !strings.Contains(err.Error(), `cascade on_failed of type "report.export", statement 1`) {
			t.Fatalf("err = %v", err)
		}
		requireRow(t, db, "j1", jobs.StatusProcessing, 1, 0)
		if n := db.Events(t, "j1", jobs.EventFailed); n != 0 {
			t.Fatalf("failed events = %d", n)
		}
	})
}

func TestRelease(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("ReleaseQueuesTheJobKeepsTheCursorAndFencesTheAttempt", func(t *testing.T) {
		t.Parallel()
		db, store := setup(t, nil)
		lease := queued(t, db, store, jobstest.Job{ID: "j1", Type: "crawl.site", Cursor: 5, Total: ptr[int64](9)}, "w1")
		requireNoErr(t, store.Release(ctx, lease))
		requireRow(t, db, "j1", jobs.StatusQueued, 1, 5)
		if n := db.Events(t, "j1", jobs.EventReleased); n != 1 {
			t.Fatalf("released events = %d", n)
		}
		requireIs(t, store.Release(ctx, lease), jobs.ErrStaleWorker)
		hb, _ := heartbeater(t, store)
		_, err := hb.Heartbeat(ctx, lease, 1)
		requireIs(t, err, jobs.ErrStaleWorker)
		next := claim(t, store, "j1", 1, "w2")
		if next.Generation != 2 || next.Cursor != 5 {
			t.Fatalf("next lease = %+v", next)
		}
		requireLate(t, db, "j1", [2]string{"Release", "stale_worker"}, [2]string{"Heartbeat", "stale_worker"})
	})

	t.Run("ReleaseOfAReapedJobIsTerminal", func(t *testing.T) {
		t.Parallel()
		db, store := setup(t, nil)
		lease := queued(t, db, store, jobstest.Job{ID: "j1", Type: "report.export"}, "w1")
		backdate(t, db, "j1", time.Hour, 30*time.Minute)
		if !reap(t, store, "j1") {
			t.Fatal("not reaped")
		}
		requireIs(t, store.Release(ctx, lease), jobs.ErrJobTerminal)
		requireRow(t, db, "j1", jobs.StatusFailed, 1, 0)
	})
}
