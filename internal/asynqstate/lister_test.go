package asynqstate

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/jobreaper/jobreaper/jobs/jobstest"
	"github.com/jobreaper/jobreaper/queue"
)

// blockingHandler holds every task until release is closed (or the
// server cancels it), so tasks stay active while the test lists them.
type blockingHandler struct{ release chan struct{} }

func (h blockingHandler) ProcessTask(ctx context.Context, _ *asynq.Task) error {
	select {
	case <-h.release:
	case <-ctx.Done():
	}
	return nil
}

// listerBundle is one lister test's fixtures on the real Redis: a queue of
// its own, removed at cleanup.
type listerBundle struct {
	rc     *redis.Client
	insp   *asynq.Inspector
	client *asynq.Client
	queue  string
	lister *InspectorLister
}

func setupLister(t testing.TB) *listerBundle {
	t.Helper()
	rc := realRedis(t)
	b := &listerBundle{
		rc:     rc,
		insp:   asynq.NewInspectorFromRedisClient(rc),
		client: asynq.NewClientFromRedisClient(rc),
		queue:  unique(t, "lister-"),
	}
	deleteQueueAtCleanup(t, rc, b.queue)
	var err error
	if b.lister, err = NewInspectorLister(b.insp); err != nil {
		t.Fatal(err)
	}
	return b
}

// runActive enqueues tasks with the given IDs and serves them with a
// handler that blocks until the test ends; it returns once all are active.
func (b *listerBundle) runActive(t testing.TB, ids ...string) {
	t.Helper()
	release := make(chan struct{})
	// Cleanups run last-registered first: the handlers are released, then
	// the server shuts down, then the queue is deleted.
	startServer(t, b.rc, b.queue, asynq.Config{Concurrency: len(ids)}, blockingHandler{release})
	t.Cleanup(func() { close(release) })
	for _, id := range ids {
		if _, err := b.client.EnqueueContext(t.Context(), asynq.NewTask("report.export", nil), asynq.TaskID(id), asynq.Queue(b.queue)); err != nil {
			t.Fatal(err)
		}
	}
	jobstest.Eventually(t, fmt.Sprintf("%d tasks are active", len(ids)), func() bool {
		got, err := b.insp.ListActiveTasks(b.queue, asynq.PageSize(1000))
		return err == nil && len(got) == len(ids)
	})
}

func TestInspectorLister(t *testing.T) {
	t.Parallel()

	t.Run("ListsEveryActiveTaskAcrossPages", func(t *testing.T) {
		t.Parallel()
		b := setupLister(t)
		want := []string{"J1", "J2", "J3", "J4", "J5"}
		b.runActive(t, want...)

		// Pages of 2 (below the public minimum, set directly) make the
		// five tasks span three pages plus the empty one that ends the loop.
		small := &InspectorLister{inspector: b.insp, pageSize: 2}
		for name, l := range map[string]*InspectorLister{"page size 1000": b.lister, "page size 2": small} {
			got, err := l.ListActive(t.Context(), b.queue)
			if err != nil {
				t.Fatalf("%s: ListActive: %v", name, err)
			}
			slices.Sort(got.IDs)
			if !slices.Equal(got.IDs, want) || got.EmptyIDs != 0 || got.NotFound {
				t.Fatalf("%s: ListActive = %+v, want IDs %v, no empty IDs, found", name, got, want)
			}
		}
	})

	t.Run("QueuesIncludesTheTestQueue", func(t *testing.T) {
		t.Parallel()
		b := setupLister(t)
		if _, err := b.client.EnqueueContext(t.Context(), asynq.NewTask("report.export", nil), asynq.Queue(b.queue)); err != nil {
			t.Fatal(err)
		}
		qs, err := b.lister.Queues(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Contains(qs, b.queue) || !slices.IsSorted(qs) {
			t.Fatalf("Queues = %v, want a sorted list containing %s", qs, b.queue)
		}
	})

	t.Run("QueueAsynqNeverSawIsNotFound", func(t *testing.T) {
		t.Parallel()
		b := setupLister(t)
		got, err := b.lister.ListActive(t.Context(), unique(t, "never-seen-"))
		if err != nil || !got.NotFound || len(got.IDs) != 0 || got.EmptyIDs != 0 {
			t.Fatalf("ListActive of an unknown queue = %+v, %v; want NotFound and no error", got, err)
		}
	})

	t.Run("ActiveEntryWhoseTaskHashIsGoneCountsAsEmptyID", func(t *testing.T) {
		t.Parallel()
		b := setupLister(t)
		// A pending task makes asynq know the queue; the active entry
		// "ghost" has no task hash asynq:{queue}:t:ghost.
		if _, err := b.client.EnqueueContext(t.Context(), asynq.NewTask("report.export", nil), asynq.Queue(b.queue)); err != nil {
			t.Fatal(err)
		}
		active := "asynq:{" + b.queue + "}:active"
		if err := b.rc.LPush(t.Context(), active, "ghost").Err(); err != nil {
			t.Fatal(err)
		}
		// DeleteQueue refuses a queue with active entries: remove it first.
		t.Cleanup(func() { _ = b.rc.LRem(context.Background(), active, 0, "ghost").Err() })
		got, err := b.lister.ListActive(t.Context(), b.queue)
		if err != nil || got.EmptyIDs != 1 || len(got.IDs) != 0 || got.NotFound {
			t.Fatalf("ListActive = %+v, %v; want 1 empty ID and no IDs", got, err)
		}
	})

	t.Run("CancelledContextStopsBeforeAPage", func(t *testing.T) {
		t.Parallel()
		b := setupLister(t)
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		_, err := b.lister.ListActive(ctx, b.queue)
		if !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), b.queue) {
			t.Fatalf("ListActive with a cancelled context: err = %v, want context.Canceled naming the queue", err)
		}
		if _, err := b.lister.Queues(ctx); !errors.Is(err, context.Canceled) {
			t.Fatalf("Queues with a cancelled context: err = %v, want context.Canceled", err)
		}
	})

	t.Run("RedisFailureIsAnErrorNamingTheQueue", func(t *testing.T) {
		t.Parallel()
		mr, mc := miniRedis(t)
		l, err := NewInspectorLister(asynq.NewInspectorFromRedisClient(mc))
		if err != nil {
			t.Fatal(err)
		}
		mr.Close()
		got, err := l.ListActive(t.Context(), "exports")
		if err == nil || got.NotFound || !strings.Contains(err.Error(), `queue "exports"`) {
			t.Fatalf("ListActive with Redis down = %+v, %v; want an error naming queue \"exports\", not NotFound", got, err)
		}
	})

	t.Run("PageSizeBelowOneThousandIsRefused", func(t *testing.T) {
		t.Parallel()
		_, err := NewInspectorLister(nil, WithPageSize(999))
		if !errors.Is(err, queue.ErrBadOption) || !strings.Contains(err.Error(), "WithPageSize(999)") || !strings.Contains(err.Error(), "at least 1000") {
			t.Fatalf("NewInspectorLister(WithPageSize(999)): err = %v, want queue.ErrBadOption naming the value and the minimum", err)
		}
		l, err := NewInspectorLister(nil, WithPageSize(5000))
		if err != nil || l.pageSize != 5000 {
			t.Fatalf("NewInspectorLister(WithPageSize(5000)) = page size %d, %v; want 5000", l.pageSize, err)
		}
	})
}
