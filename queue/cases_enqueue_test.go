package queue

import (
	"errors"
	"strings"
	"testing"

	"github.com/hibiken/asynq"

	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
)

// requireNoTask fails the test when asynq holds a task id in queue, in any
// state.
func requireNoTask(t *testing.T, insp *asynq.Inspector, queue, id string) {
	t.Helper()
	info, err := insp.GetTaskInfo(queue, id)
	if err == nil {
		t.Fatalf("asynq holds task %s in queue %s (state %s), want none", id, queue, info.State)
	}
	if !errors.Is(err, asynq.ErrTaskNotFound) && !errors.Is(err, asynq.ErrQueueNotFound) {
		t.Fatalf("GetTaskInfo(%s, %s): %v", queue, id, err)
	}
}

// B39: the product calls the enqueue helper with a video.transcode task for
// a row whose type is report.export.
func TestCase_B39_TaskOfTheWrongTypeForItsRow(t *testing.T) {
	t.Parallel()
	rc := realRedis(t)
	queue := unique(t, "b39-")
	deleteQueueAtCleanup(t, rc, queue)
	b := setupEnqueue(t, rc)
	id := unique(t, "J39-")
	b.db.Insert(t, jobstest.Job{ID: id, Type: "report.export", Status: jobs.StatusQueued, Queue: queue})

	_, err := Enqueue(t.Context(), b.client, b.store, asynq.NewTask("video.transcode", nil), id)
	if !errors.Is(err, ErrTypeConflict) {
		t.Fatalf("Enqueue of a video.transcode task for a report.export row: err = %v, want ErrTypeConflict", err)
	}
	for _, want := range []string{`"video.transcode"`, `"report.export"`, id} {
		if !strings.Contains(err.Error(), want) {
			t.Fatalf("error %q does not name %s", err, want)
		}
	}
	requireNoTask(t, b.insp, queue, id)
	requireRow(t, b.db, id, jobs.StatusQueued, 0)
}

// Enqueue refuses what the start guard could never claim: a task put into
// an asynq group is replaced by an aggregated task whose ID is no job's.
func TestEnqueueRefusesAGroupTheGuardCouldNeverClaim(t *testing.T) {
	t.Parallel()
	rc := realRedis(t)
	queue := unique(t, "group-")
	deleteQueueAtCleanup(t, rc, queue)
	b := setupEnqueue(t, rc)
	id := unique(t, "Jgroup-")
	b.db.Insert(t, jobstest.Job{ID: id, Type: "report.export", Status: jobs.StatusQueued, Queue: queue})

	_, err := Enqueue(t.Context(), b.client, b.store, asynq.NewTask("report.export", nil), id, asynq.Group("nightly"))
	if !errors.Is(err, ErrOptionConflict) || !strings.Contains(err.Error(), "nightly") {
		t.Fatalf("Enqueue with asynq.Group: err = %v, want ErrOptionConflict naming the group", err)
	}
	requireNoTask(t, b.insp, queue, id)
	if groups, err := b.insp.Groups(queue); err == nil && len(groups) != 0 {
		t.Fatalf("queue %s has groups %v after a refused Enqueue", queue, groups)
	}

	// The same row enqueues once the task is right.
	if _, err := Enqueue(t.Context(), b.client, b.store, asynq.NewTask("report.export", nil), id); err != nil {
		t.Fatalf("Enqueue of the right task: %v", err)
	}
	if info, err := b.insp.GetTaskInfo(queue, id); err != nil || info.State != asynq.TaskStatePending || info.Type != "report.export" {
		t.Fatalf("task %s = %+v (%v), want a pending report.export task", id, info, err)
	}
}
