package asynqstate

import (
	"testing"

	"github.com/hibiken/asynq"
)

// TestInspectorListerTaskStatus looks tasks up on the real Redis in the
// states the reaper's lost-task check distinguishes.
func TestInspectorListerTaskStatus(t *testing.T) {
	t.Parallel()
	b := setupLister(t)
	ctx := t.Context()
	for _, id := range []string{"pending", "archived"} {
		if _, err := b.client.EnqueueContext(ctx, asynq.NewTask("report.export", nil), asynq.TaskID(id), asynq.Queue(b.queue)); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.insp.ArchiveTask(b.queue, "archived"); err != nil {
		t.Fatal(err)
	}
	for id, want := range map[string]TaskStatus{"pending": TaskPending, "archived": TaskArchived, "gone": TaskNotFound} {
		got, err := b.lister.TaskStatus(ctx, b.queue, id)
		if err != nil || got != want {
			t.Errorf("TaskStatus(%s) = %q, %v; want %q", id, got, err, want)
		}
	}
	if got, err := b.lister.TaskStatus(ctx, b.queue+"-never-seen", "x"); err != nil || got != TaskQueueNotFound {
		t.Errorf("TaskStatus in an unknown queue = %q, %v; want queue_not_found", got, err)
	}
	if TaskArchived.WillRun() || TaskCompleted.WillRun() || TaskNotFound.WillRun() || !TaskRetry.WillRun() ||
		!TaskPending.WillRun() || !TaskQueueNotFound.WillRun() {
		t.Error("WillRun: only archived, completed and not-found tasks are never run again; an unknown queue proves nothing")
	}
}
