package asynqstate

import (
	"context"
	"testing"
	"time"

	"github.com/hibiken/asynq"
)

// TestStatusReaderMatchesTheInspector holds StatusReader's reading of
// asynq's keys to what asynq's own Inspector says, for every state a test
// can put a task in without a worker, a task asynq does not have and a
// queue it does not know, across two pipelines.
func TestStatusReaderMatchesTheInspector(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rc := realRedis(t)
	q := unique(t, "statuses-")
	deleteQueueAtCleanup(t, rc, q)
	client := asynq.NewClientFromRedisClient(rc)
	insp := asynq.NewInspectorFromRedisClient(rc)
	lister, err := NewInspectorLister(insp)
	if err != nil {
		t.Fatal(err)
	}
	enqueue := func(id string, opts ...asynq.Option) {
		t.Helper()
		if _, err := client.EnqueueContext(ctx, asynq.NewTask("t", nil), append([]asynq.Option{asynq.TaskID(id), asynq.Queue(q)}, opts...)...); err != nil {
			t.Fatal(err)
		}
	}
	enqueue("pending")
	enqueue("scheduled", asynq.ProcessIn(time.Hour))
	enqueue("archived")
	if err := insp.ArchiveTask(q, "archived"); err != nil {
		t.Fatal(err)
	}
	refs := []TaskRef{{q, "pending"}, {q, "scheduled"}, {q, "archived"}, {q, "gone"}, {q + "-unknown", "x"}}
	want := []TaskStatus{TaskPending, TaskScheduled, TaskArchived, TaskNotFound, TaskQueueNotFound}
	// More than one pipeline: the same refs again after filler lookups.
	for range StatusChunk {
		refs = append(refs, TaskRef{q, "gone"})
		want = append(want, TaskNotFound)
	}
	refs = append(refs, refs[:5]...)
	want = append(want, want[:5]...)

	got, err := NewStatusReader(rc, 0).TaskStatuses(ctx, refs)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(want) {
		t.Fatalf("%d statuses for %d refs", len(got), len(refs))
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("ref %d %+v: status %s, want %s", i, refs[i], got[i], want[i])
		}
		if i < 5 {
			viaInspector, err := lister.TaskStatus(ctx, refs[i].Queue, refs[i].ID)
			if err != nil || viaInspector != got[i] {
				t.Fatalf("ref %+v: the Inspector says %s (%v), the reader %s", refs[i], viaInspector, err, got[i])
			}
		}
	}
}

// TestLiveQueuesListsTheQueuesOfRunningServers: a running asynq server's
// queues are live; once it has shut down they are not.
func TestLiveQueuesListsTheQueuesOfRunningServers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rc := realRedis(t)
	q := unique(t, "live-")
	deleteQueueAtCleanup(t, rc, q)
	reader := NewStatusReader(rc, 0)
	live, err := reader.LiveQueues(ctx)
	if err != nil || live[q] {
		t.Fatalf("before any server: live[%s] = %v (%v), want false", q, live[q], err)
	}
	srv := asynq.NewServerFromRedisClient(rc, asynq.Config{Queues: map[string]int{q: 1}, Logger: asynqLogger{}})
	if err := srv.Start(asynq.HandlerFunc(func(context.Context, *asynq.Task) error { return nil })); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		live, err = reader.LiveQueues(ctx)
		if err == nil && live[q] {
			break
		}
		if time.Now().After(deadline) {
			srv.Shutdown()
			t.Fatalf("a running server's queue %s is not live within 20s (%v)", q, err)
		}
		time.Sleep(50 * time.Millisecond) // polling for the server's first heartbeat
	}
	srv.Shutdown()
	live, err = reader.LiveQueues(ctx)
	if err != nil || live[q] {
		t.Fatalf("after shutdown: live[%s] = %v (%v), want false", q, live[q], err)
	}
}
