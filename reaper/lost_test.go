package reaper_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jobreaper/jobreaper/internal/asynqstate"
	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
	"github.com/jobreaper/jobreaper/queue"
)

func TestReapLost(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	for _, tc := range []struct {
		name   string
		status asynqstate.TaskStatus // "" = the lookup finds nothing
	}{
		{"GoneTaskOfAKilledWorkerIsReapedAsLostTask", ""},
		{"ArchivedTaskIsReapedAsLostTask", asynqstate.TaskArchived},
		{"CompletedTaskIsReapedAsLostTask", asynqstate.TaskCompleted},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			b.stalled(t, "J1")
			b.lister.queues["default"] = asynqstate.ActiveTasks{}
			if tc.status != "" {
				b.lister.statuses = map[string]asynqstate.TaskStatus{"J1": tc.status}
			}
			res, err := runOnce(t, ctx, b.reaper)
			if err != nil || res.Reaped != 1 || res.ReapedBy["lost_task"] != 1 || res.Errors != 0 || res.Scanned != 0 {
				t.Fatalf("result = %+v, err = %v; want 1 lost_task reap", res, err)
			}
			if row := b.db.Read(t, "J1"); row.Status != jobs.StatusFailed || row.FailureReason != "lost_task" {
				t.Fatalf("J1 = %+v, want FAILED lost_task", row)
			}
			if n := b.db.Events(t, "J1", "reaped"); n != 1 {
				t.Fatalf("reaped events = %d, want 1", n)
			}
			if v, err := b.redis.Get(queue.MarkerKey("J1")); err != nil || v != "1" {
				t.Fatalf("marker = %q, %v; want generation 1", v, err)
			}
		})
	}

	t.Run("LostJobsTheRuleCannotJudgeAreCountedNotIgnored", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		// Idle long enough, no task anywhere, but no rule applies: a type
		// without a job_types row, unsafe limits, no start time. Each is
		// counted under its skip (and warned about), never reaped, and
		// never left unseen.
		b.db.JobType(t, "t.lowstall", "10 minutes", "1 second", "")
		b.db.Insert(t, jobstest.Job{ID: "unknown", Type: "t.none", Generation: 1, Queue: "default",
			StartedAgo: jobstest.Ago(31 * time.Minute), IdleAgo: 21 * time.Minute})
		b.db.Insert(t, jobstest.Job{ID: "badlimits", Type: "t.lowstall", Generation: 1, Queue: "default",
			StartedAgo: jobstest.Ago(31 * time.Minute), IdleAgo: 21 * time.Minute})
		b.db.Insert(t, jobstest.Job{ID: "nostart", Type: "report.export", Generation: 1, Queue: "default",
			StartedAgo: jobstest.Ago(31 * time.Minute), IdleAgo: 21 * time.Minute})
		b.db.Exec(t, `UPDATE `+b.db.Table("jobs")+` SET started_at = NULL WHERE id = 'nostart'`)
		b.stalled(t, "J1")
		b.lister.queues["default"] = asynqstate.ActiveTasks{}
		res, err := runOnce(t, ctx, b.reaper)
		if err != nil || res.Reaped != 1 || res.ReapedBy["lost_task"] != 1 || res.Skipped["unknown_type"] != 1 ||
			res.Skipped["bad_limits"] != 1 || res.Skipped["no_start_time"] != 1 {
			t.Fatalf("result = %+v, err = %v; want J1 reaped as lost_task and unknown_type, bad_limits, no_start_time 1 each", res, err)
		}
		for _, id := range []string{"unknown", "badlimits", "nostart"} {
			if row := b.db.Read(t, id); row.Status != jobs.StatusProcessing {
				t.Fatalf("%s = %+v, want PROCESSING", id, row)
			}
		}
	})

	t.Run("JobOfAQueueAsynqDoesNotKnowIsHeldWhileNoLiveServerServesIt", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.stalled(t, "J1")
		b.lister.queues["default"] = asynqstate.ActiveTasks{}
		b.lister.statuses = map[string]asynqstate.TaskStatus{"J1": asynqstate.TaskQueueNotFound}
		b.lister.dead = map[string]bool{"default": true}
		res, err := runOnce(t, ctx, b.reaper)
		if err != nil || res.Reaped != 0 || res.Skipped["lost_held"] != 1 {
			t.Fatalf("result = %+v, err = %v; want lost_held 1", res, err)
		}
		if row := b.db.Read(t, "J1"); row.Status != jobs.StatusProcessing {
			t.Fatalf("J1 = %+v, want PROCESSING", row)
		}
	})

	t.Run("TaskWaitingForRetryIsLeftToItsNextAttempt", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.stalled(t, "J1")
		b.lister.queues["default"] = asynqstate.ActiveTasks{}
		b.lister.statuses = map[string]asynqstate.TaskStatus{"J1": asynqstate.TaskRetry}
		res, err := runOnce(t, ctx, b.reaper)
		if err != nil || res.Reaped != 0 || res.Skipped["awaiting_retry"] != 1 {
			t.Fatalf("result = %+v, err = %v; want awaiting_retry 1", res, err)
		}
		if row := b.db.Read(t, "J1"); row.Status != jobs.StatusProcessing {
			t.Fatalf("J1 = %+v, want PROCESSING", row)
		}
	})

	t.Run("RowsNotStalledWithoutQueueOrOfAFailedQueueAreNeverLookedUp", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.db.Insert(t, jobstest.Job{ID: "fresh", Type: "report.export", Generation: 1, Queue: "default",
			StartedAgo: jobstest.Ago(31 * time.Minute), IdleAgo: 2 * time.Minute})
		b.db.Insert(t, jobstest.Job{ID: "noqueue", Type: "report.export", Generation: 1,
			StartedAgo: jobstest.Ago(31 * time.Minute), IdleAgo: 21 * time.Minute})
		b.db.Insert(t, jobstest.Job{ID: "brokenq", Type: "report.export", Generation: 1, Queue: "broken",
			StartedAgo: jobstest.Ago(31 * time.Minute), IdleAgo: 21 * time.Minute})
		b.lister.queues["default"] = asynqstate.ActiveTasks{}
		b.lister.failed["broken"] = errors.New("redis: i/o timeout")
		res, err := runOnce(t, ctx, b.reaper)
		if err != nil || res.Reaped != 0 || res.Errors != 1 {
			t.Fatalf("result = %+v, err = %v; want nothing reaped and the one listing error", res, err)
		}
		for _, id := range []string{"fresh", "noqueue", "brokenq"} {
			if row := b.db.Read(t, id); row.Status != jobs.StatusProcessing {
				t.Fatalf("%s = %+v, want PROCESSING", id, row)
			}
		}
	})

	t.Run("StalledJobWithAnActiveTaskIsReapedOnceAsStalled", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.stalled(t, "J1")
		b.lister.queues["default"] = asynqstate.ActiveTasks{IDs: []string{"J1"}}
		res, err := runOnce(t, ctx, b.reaper)
		if err != nil || res.Reaped != 1 || res.ReapedBy["stalled"] != 1 || res.ReapedBy["lost_task"] != 0 {
			t.Fatalf("result = %+v, err = %v; want one stalled reap", res, err)
		}
		if n := b.db.Events(t, "J1", "reaped"); n != 1 {
			t.Fatalf("reaped events = %d, want 1", n)
		}
	})
}
