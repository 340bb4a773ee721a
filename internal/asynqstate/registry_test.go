package asynqstate

import (
	"context"
	"errors"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/hibiken/asynq"
)

// TestLiveServersNamesTheProcessesAndQueues: a running asynq server is in
// the registry as this process's "<host>:<pid>" (the start guard's default
// worker name) with its queue; a stopped one (it no longer takes tasks, its
// process runs on) keeps its process there but not its queue; after
// Shutdown neither is.
func TestLiveServersNamesTheProcessesAndQueues(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rc := realRedis(t)
	q := unique(t, "registry-")
	deleteQueueAtCleanup(t, rc, q)
	host, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	self := host + ":" + strconv.Itoa(os.Getpid())
	reader := NewStatusReader(rc, 0)
	srv := asynq.NewServerFromRedisClient(rc, asynq.Config{Queues: map[string]int{q: 1}, Logger: asynqLogger{}})
	if err := srv.Start(asynq.HandlerFunc(func(context.Context, *asynq.Task) error { return nil })); err != nil {
		t.Fatal(err)
	}
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			srv.Shutdown()
		}
	})
	await := func(what string, cond func(Registry) bool) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second) // asynq heartbeats every 5 s
		for {
			reg, err := reader.LiveServers(ctx)
			if err == nil && cond(reg) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within 30s (%+v, %v)", what, reg, err)
			}
			time.Sleep(50 * time.Millisecond) // polling asynq's heartbeat
		}
	}
	await("a running server's process and queue are live", func(r Registry) bool { return r.Processes[self] && r.Queues[q] })
	srv.Stop()
	await("a stopped server's queue is not served, its process still runs", func(r Registry) bool { return r.Processes[self] && !r.Queues[q] })
	srv.Shutdown()
	stopped = true
	reg, err := reader.LiveServers(ctx)
	if err != nil || reg.Queues[q] {
		t.Fatalf("after shutdown: %+v (%v), want the queue gone", reg, err)
	}
	// Other tests of this process may run servers of their own: the
	// process stays live while one does, so only the queue is checked.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := reader.LiveServers(cctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("LiveServers on a cancelled context = %v", err)
	}
}

// TestTaskEndsReadsTheLastError: a task asynq archived after its handler's
// error carries that error; one archived by hand carries none; a task or a
// queue asynq does not have is not found.
func TestTaskEndsReadsTheLastError(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rc := realRedis(t)
	q := unique(t, "ends-")
	deleteQueueAtCleanup(t, rc, q)
	client := asynq.NewClientFromRedisClient(rc)
	insp := asynq.NewInspectorFromRedisClient(rc)
	for _, id := range []string{"failed", "by-hand"} {
		if _, err := client.EnqueueContext(ctx, asynq.NewTask("t", nil), asynq.TaskID(id), asynq.Queue(q), asynq.MaxRetry(0)); err != nil {
			t.Fatal(err)
		}
	}
	if err := insp.ArchiveTask(q, "by-hand"); err != nil {
		t.Fatal(err)
	}
	srv := asynq.NewServerFromRedisClient(rc, asynq.Config{Queues: map[string]int{q: 1}, Logger: asynqLogger{}})
	if err := srv.Start(asynq.HandlerFunc(func(context.Context, *asynq.Task) error { return errors.New("upstream said no") })); err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	refs := []TaskRef{{q, "failed"}, {q, "by-hand"}, {q, "gone"}, {q + "-unknown", "x"}}
	want := []TaskEnd{{TaskArchived, "upstream said no"}, {TaskArchived, ""}, {TaskNotFound, ""}, {TaskQueueNotFound, ""}}
	deadline := time.Now().Add(30 * time.Second)
	for {
		got, err := NewStatusReader(rc, 0).TaskEnds(ctx, refs)
		if err == nil && len(got) == len(want) && got[0] == want[0] {
			for i := range want {
				if got[i] != want[i] {
					t.Fatalf("ref %+v: %+v, want %+v", refs[i], got[i], want[i])
				}
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("TaskEnds = %+v (%v), want %+v within 30s", got, err, want)
		}
		time.Sleep(50 * time.Millisecond) // polling the server's run of the task
	}
	if ErrLeaseExpiredText != "asynq: task lease expired" {
		t.Fatalf("asynq's lease-expired error reads %q; the rule compares against it", ErrLeaseExpiredText)
	}
}
