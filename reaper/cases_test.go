package reaper_test

import (
	"context"
	"testing"
	"time"

	"github.com/jobreaper/jobreaper/internal/asynqstate"
	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
	"github.com/jobreaper/jobreaper/queue"
	"github.com/jobreaper/jobreaper/reaper"
)

// B12: a job that commits a batch every 2 minutes has an updated_at at most
// 5 minutes old (the heartbeat limiter's bound), so a scan 3 hours after its
// start, far past crawl.site's 60 minutes, leaves it alone.
func TestCase_B12_ProgressingJobPastItsLimitIsNotReaped(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.db.Insert(t, jobstest.Job{ID: "J12", Type: "crawl.site", Generation: 1, Queue: "default",
		StartedAgo: jobstest.Ago(3 * time.Hour), IdleAgo: 5 * time.Minute})
	b.lister.queues["default"] = asynqstate.ActiveTasks{IDs: []string{"J12"}}
	before := b.db.Read(t, "J12")
	res, err := runOnce(t, context.Background(), b.reaper)
	if err != nil || res.Reaped != 0 || res.Skipped["progressing"] != 1 {
		t.Fatalf("result = %+v, err = %v; want J12 skipped as progressing", res, err)
	}
	if after := b.db.Read(t, "J12"); after != before {
		t.Fatalf("J12 changed: %+v -> %+v", before, after)
	}
	if n := b.db.Events(t, "J12", "reaped"); n != 0 {
		t.Fatalf("reaped events = %d, want 0", n)
	}
	if b.redis.Exists(queue.MarkerKey("J12")) {
		t.Fatal("J12 has a marker")
	}
}

// B15: a job_types row whose stall timeout equals the heartbeat interval
// (5 min) would reap a live worker between two heartbeats. Its jobs are
// skipped as bad_limits with a warning: J15 (video.transcode, past its 120
// minutes, last write 5m01s ago) is not reaped. With the baseline 15 minute
// stall timeout it stays PROCESSING too.
func TestCase_B15_StallTimeoutOfOneHeartbeatIsSkippedAsBadLimits(t *testing.T) {
	t.Parallel()

	t.Run("TypeRowWithFiveMinuteStallIsBadLimits", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.db.JobType(t, "video.transcode", "120 minutes", "5 minutes", "")
		b.db.Insert(t, jobstest.Job{ID: "J15", Type: "video.transcode", Generation: 1,
			StartedAgo: jobstest.Ago(125 * time.Minute), IdleAgo: 5*time.Minute + time.Second})
		b.lister.queues["default"] = asynqstate.ActiveTasks{IDs: []string{"J15"}}
		res, err := runOnce(t, context.Background(), b.reaper)
		if err != nil || res.Reaped != 0 || res.Skipped["bad_limits"] != 1 {
			t.Fatalf("result = %+v, err = %v; want J15 skipped as bad_limits", res, err)
		}
		if row := b.db.Read(t, "J15"); row.Status != jobs.StatusProcessing {
			t.Fatalf("J15 = %+v, want PROCESSING (0 FAILED writes)", row)
		}
		snap, err := b.db.Daemon().Get(context.Background(), "J15")
		if err != nil {
			t.Fatal(err)
		}
		now, _ := b.db.Daemon().Now(context.Background())
		v := reaper.Decide(&snap, now, baselineRule)
		if want := "stall timeout 5m0s is below 2 x heartbeat interval + scan interval = 11m0s"; v.Why != want {
			t.Fatalf("bad_limits rule = %q, want %q", v.Why, want)
		}
	})

	t.Run("BaselineStallKeepsTheLiveJobProcessing", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.db.JobType(t, "video.transcode", "120 minutes", "", "")
		b.db.Insert(t, jobstest.Job{ID: "J15", Type: "video.transcode", Generation: 1,
			StartedAgo: jobstest.Ago(125 * time.Minute), IdleAgo: 5*time.Minute + time.Second})
		b.lister.queues["default"] = asynqstate.ActiveTasks{IDs: []string{"J15"}}
		res, err := runOnce(t, context.Background(), b.reaper)
		if err != nil || res.Reaped != 0 || res.Skipped["progressing"] != 1 {
			t.Fatalf("result = %+v, err = %v; want J15 skipped as progressing", res, err)
		}
		if row := b.db.Read(t, "J15"); row.Status != jobs.StatusProcessing {
			t.Fatalf("J15 = %+v, want PROCESSING", row)
		}
	})
}
