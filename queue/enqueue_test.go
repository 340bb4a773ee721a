package queue

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
)

// enqueueBundle is one enqueue test's fixtures: its own schema with the
// job types, and an asynq client and inspector over rc.
type enqueueBundle struct {
	db     *jobstest.DB
	store  *jobs.Store
	client *asynq.Client
	insp   *asynq.Inspector
}

func setupEnqueue(t *testing.T, rc *redis.Client) *enqueueBundle {
	t.Helper()
	db := jobstest.New(t)
	db.JobType(t, "report.export", "30 minutes", "", "3 hours")
	db.JobType(t, "crawl.site", "60 minutes", "", "")
	return &enqueueBundle{
		db:     db,
		store:  db.Store(),
		client: asynq.NewClientFromRedisClient(rc),
		insp:   asynq.NewInspectorFromRedisClient(rc),
	}
}

func TestEnqueue(t *testing.T) {
	t.Parallel()
	task := func() *asynq.Task { return asynq.NewTask("report.export", []byte(`{"report":1}`)) }

	t.Run("TaskGetsTheJobIDTheRowsQueueAndTheTypesHardTimeout", func(t *testing.T) {
		t.Parallel()
		rc := realRedis(t)
		queue := unique(t, "enqueue-")
		deleteQueueAtCleanup(t, rc, queue)
		b := setupEnqueue(t, rc)
		b.db.Insert(t, jobstest.Job{ID: "J1", Type: "report.export", Status: jobs.StatusQueued, Queue: queue})

		if _, err := Enqueue(t.Context(), b.client, b.store, task(), "J1"); err != nil {
			t.Fatalf("Enqueue: %v", err)
		}
		info, err := b.insp.GetTaskInfo(queue, "J1")
		if err != nil {
			t.Fatalf("GetTaskInfo(%s, J1): %v", queue, err)
		}
		if info.ID != "J1" || info.Queue != queue || info.Timeout != 3*time.Hour || info.State != asynq.TaskStatePending {
			t.Fatalf("task = ID %q queue %q timeout %s state %s; want J1, %s, 3h, pending", info.ID, info.Queue, info.Timeout, info.State, queue)
		}
	})

	t.Run("NullQueueAndHardTimeoutTakeTheDefaults", func(t *testing.T) {
		t.Parallel()
		// The "default" queue of the shared Redis is not ours to fill.
		_, mc := miniRedis(t)
		b := setupEnqueue(t, mc)
		b.db.Insert(t, jobstest.Job{ID: "J2", Type: "crawl.site", Status: jobs.StatusQueued})
		info, err := Enqueue(t.Context(), b.client, b.store, asynq.NewTask("crawl.site", nil), "J2")
		if err != nil {
			t.Fatalf("Enqueue: %v", err)
		}
		if info.ID != "J2" || info.Queue != "default" || info.Timeout != 24*time.Hour {
			t.Fatalf("task = ID %q queue %q timeout %s; want J2, default, 24h", info.ID, info.Queue, info.Timeout)
		}
		got, err := b.insp.GetTaskInfo("default", "J2")
		if err != nil || got.Timeout != jobs.HardTimeoutDefault {
			t.Fatalf("stored task timeout = %v (%v), want %s", got, err, jobs.HardTimeoutDefault)
		}
	})

	t.Run("MissingRowIsNotFoundAndNothingIsEnqueued", func(t *testing.T) {
		t.Parallel()
		mr, mc := miniRedis(t)
		b := setupEnqueue(t, mc)
		_, err := Enqueue(t.Context(), b.client, b.store, task(), "J-nobody")
		if !errors.Is(err, jobs.ErrNotFound) || !strings.Contains(err.Error(), "J-nobody") {
			t.Fatalf("Enqueue of a job without a row: err = %v, want jobs.ErrNotFound naming the job", err)
		}
		if keys := mr.Keys(); len(keys) != 0 {
			t.Fatalf("Enqueue without a row wrote Redis keys %v", keys)
		}
	})

	t.Run("SecondEnqueueOfTheSameJobIsATaskIDConflict", func(t *testing.T) {
		t.Parallel()
		_, mc := miniRedis(t)
		b := setupEnqueue(t, mc)
		b.db.Insert(t, jobstest.Job{ID: "J3", Type: "report.export", Status: jobs.StatusQueued, Queue: "exports"})
		if _, err := Enqueue(t.Context(), b.client, b.store, task(), "J3"); err != nil {
			t.Fatal(err)
		}
		_, err := Enqueue(t.Context(), b.client, b.store, task(), "J3")
		if !errors.Is(err, asynq.ErrTaskIDConflict) || !strings.Contains(err.Error(), "J3") {
			t.Fatalf("second Enqueue: err = %v, want asynq.ErrTaskIDConflict naming J3", err)
		}
	})

	t.Run("CallerOptionsContradictingTheRowAreRefused", func(t *testing.T) {
		t.Parallel()
		mr, mc := miniRedis(t)
		b := setupEnqueue(t, mc)
		b.db.Insert(t, jobstest.Job{ID: "J4", Type: "report.export", Status: jobs.StatusQueued, Queue: "exports"})
		for _, opt := range []asynq.Option{asynq.TaskID("other"), asynq.Queue("critical")} {
			_, err := Enqueue(t.Context(), b.client, b.store, task(), "J4", opt)
			if !errors.Is(err, ErrOptionConflict) || !strings.Contains(err.Error(), opt.String()) {
				t.Fatalf("Enqueue with %s: err = %v, want ErrOptionConflict naming the option", opt, err)
			}
		}
		if keys := mr.Keys(); len(keys) != 0 {
			t.Fatalf("refused Enqueue wrote Redis keys %v", keys)
		}
	})

	t.Run("TerminalJobIsRefusedAndNothingIsEnqueued", func(t *testing.T) {
		t.Parallel()
		mr, mc := miniRedis(t)
		b := setupEnqueue(t, mc)
		b.db.Insert(t, jobstest.Job{ID: "J6", Type: "report.export", Status: jobs.StatusFailed, Generation: 1})
		b.db.Insert(t, jobstest.Job{ID: "J7", Type: "report.export", Status: jobs.StatusCompleted, Generation: 1})
		for _, id := range []string{"J6", "J7"} {
			if _, err := Enqueue(t.Context(), b.client, b.store, task(), id); !errors.Is(err, jobs.ErrJobTerminal) {
				t.Fatalf("Enqueue of %s: err = %v, want jobs.ErrJobTerminal", id, err)
			}
		}
		if keys := mr.Keys(); len(keys) != 0 {
			t.Fatalf("refused Enqueue wrote Redis keys %v", keys)
		}
	})

	t.Run("CallerOptionsAfterOursApply", func(t *testing.T) {
		t.Parallel()
		_, mc := miniRedis(t)
		b := setupEnqueue(t, mc)
		b.db.Insert(t, jobstest.Job{ID: "J5", Type: "report.export", Status: jobs.StatusQueued, Queue: "exports"})
		info, err := Enqueue(t.Context(), b.client, b.store, task(), "J5",
			asynq.MaxRetry(3), asynq.TaskID("J5"), asynq.Queue("exports"), asynq.Timeout(4*time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		if info.ID != "J5" || info.Queue != "exports" || info.MaxRetry != 3 || info.Timeout != 4*time.Hour {
			t.Fatalf("task = ID %q queue %q max retry %d timeout %s; want J5, exports, 3, 4h", info.ID, info.Queue, info.MaxRetry, info.Timeout)
		}
	})
}
