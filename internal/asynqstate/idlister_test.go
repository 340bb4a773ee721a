package asynqstate

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/hibiken/asynq"

	"github.com/jobreaper/jobreaper/queue"
	"github.com/jobreaper/jobreaper/queue/queuetest"
)

// TestIDListerKeyLayout holds the ID-only lister to the key layout of the
// asynq in go.mod: a real asynq.Server runs two tasks, and the keys the
// lister reads (queue set, active list, task hashes, lease set) must hold
// them. If a new asynq moves its keys, this test
// fails and names the key; the lister must then follow before it is used.
func TestIDListerKeyLayout(t *testing.T) {
	t.Parallel()
	b := setupLister(t)
	ids := []string{"layout-1", "layout-2"}
	b.runActive(t, ids...)
	ctx := t.Context()

	if ok, err := b.rc.SIsMember(ctx, asynqQueuesKey, b.queue).Result(); err != nil || !ok {
		t.Fatalf("asynq layout changed: queue %s is not a member of %s (%v); the ID-only lister cannot find queues", b.queue, asynqQueuesKey, err)
	}
	listed, err := b.rc.LRange(ctx, asynqActiveKey(b.queue), 0, -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(listed)
	if !slices.Equal(listed, ids) {
		t.Fatalf("asynq layout changed: list %s holds %v, want the active tasks %v", asynqActiveKey(b.queue), listed, ids)
	}
	for _, id := range ids {
		key := asynqTaskKeyPrefix(b.queue) + id
		if n, err := b.rc.Exists(ctx, key).Result(); err != nil || n != 1 {
			t.Fatalf("asynq layout changed: task hash %s of an active task does not exist (%v)", key, err)
		}
	}
	// The lister skips the per-entry lease check when the lease set and
	// the active list are the same size: asynq must keep one lease per
	// active entry under this key.
	leased, err := b.rc.ZRange(ctx, asynqLeaseKey(b.queue), 0, -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(leased)
	if !slices.Equal(leased, ids) {
		t.Fatalf("asynq layout changed: lease set %s holds %v, want one lease per active task %v", asynqLeaseKey(b.queue), leased, ids)
	}
}

func TestIDLister(t *testing.T) {
	t.Parallel()

	t.Run("ListsTheSameIDsAsTheInspector", func(t *testing.T) {
		t.Parallel()
		b := setupLister(t)
		want := []string{"J1", "J2", "J3", "J4", "J5"}
		b.runActive(t, want...)
		fromInspector, err := b.lister.ListActive(t.Context(), b.queue)
		if err != nil {
			t.Fatal(err)
		}
		slices.Sort(fromInspector.IDs)
		ids, err := NewIDLister(b.rc)
		if err != nil {
			t.Fatal(err)
		}
		// Chunks of 2 make five IDs span three chunks; chunks of 5 end on a
		// full chunk, so one more (empty) chunk is read.
		for name, l := range map[string]*IDLister{"chunk 1000": ids, "chunk 2": {client: b.rc, chunk: 2}, "chunk 5": {client: b.rc, chunk: 5}} {
			got, err := l.ListActive(t.Context(), b.queue)
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			if !slices.Equal(got.IDs, want) || !slices.Equal(got.IDs, fromInspector.IDs) || got.EmptyIDs != 0 || got.NotFound || len(got.Broken) != 0 {
				t.Fatalf("%s: ListActive = %+v, Inspector lister = %+v; want both %v", name, got, fromInspector, want)
			}
		}
	})

	t.Run("BrokenEntriesAreCountedAsTheInspectorCountsThemAndNamed", func(t *testing.T) {
		t.Parallel()
		b := setupLister(t)
		b.runActive(t, "live-1", "live-2")
		// Two entries whose task hash is gone, one of them twice.
		active := asynqActiveKey(b.queue)
		if err := b.rc.LPush(t.Context(), active, "ghost-b", "ghost-a", "ghost-b").Err(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = b.rc.LRem(context.Background(), active, 0, "ghost-a").Err()
			_ = b.rc.LRem(context.Background(), active, 0, "ghost-b").Err()
		})
		fromInspector, err := b.lister.ListActive(t.Context(), b.queue)
		if err != nil {
			t.Fatal(err)
		}
		l, err := NewIDLister(b.rc)
		if err != nil {
			t.Fatal(err)
		}
		got, err := l.ListActive(t.Context(), b.queue)
		if err != nil {
			t.Fatal(err)
		}
		slices.Sort(fromInspector.IDs)
		if fromInspector.EmptyIDs != 3 || got.EmptyIDs != fromInspector.EmptyIDs {
			t.Fatalf("entries without a task: Inspector lister counts %d, ID lister %d; want 3 both", fromInspector.EmptyIDs, got.EmptyIDs)
		}
		if want := []string{"live-1", "live-2"}; !slices.Equal(got.IDs, want) || !slices.Equal(fromInspector.IDs, want) {
			t.Fatalf("IDs: ID lister %v, Inspector lister %v; want %v", got.IDs, fromInspector.IDs, want)
		}
		if want := []string{"ghost-a", "ghost-b"}; !slices.Equal(got.Broken, want) {
			t.Fatalf("Broken = %v, want %v", got.Broken, want)
		}
	})

	t.Run("QueueAsynqNeverSawIsNotFound", func(t *testing.T) {
		t.Parallel()
		b := setupLister(t)
		l, err := NewIDLister(b.rc)
		if err != nil {
			t.Fatal(err)
		}
		got, err := l.ListActive(t.Context(), unique(t, "never-seen-"))
		if err != nil || !got.NotFound || len(got.IDs) != 0 {
			t.Fatalf("ListActive of an unknown queue = %+v, %v; want NotFound", got, err)
		}
		if _, err := b.client.EnqueueContext(t.Context(), asynq.NewTask("report.export", nil), asynq.Queue(b.queue)); err != nil {
			t.Fatal(err)
		}
		qs, err := l.Queues(t.Context())
		if err != nil || !slices.Contains(qs, b.queue) || !slices.IsSorted(qs) {
			t.Fatalf("Queues = %v, %v; want a sorted list containing %s", qs, err, b.queue)
		}
		if got, err := l.ListActive(t.Context(), b.queue); err != nil || got.NotFound || len(got.IDs) != 0 {
			t.Fatalf("ListActive of a known queue with nothing active = %+v, %v", got, err)
		}
	})

	t.Run("RedisFailureIsAnErrorNamingTheQueue", func(t *testing.T) {
		t.Parallel()
		mr, mc := miniRedis(t)
		l, err := NewIDLister(mc)
		if err != nil {
			t.Fatal(err)
		}
		mr.Close()
		got, err := l.ListActive(t.Context(), "exports")
		if err == nil || got.NotFound || !strings.Contains(err.Error(), `queue "exports"`) {
			t.Fatalf("ListActive with Redis down = %+v, %v; want an error naming queue \"exports\"", got, err)
		}
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		if _, err := l.Queues(ctx); !errors.Is(err, context.Canceled) {
			t.Fatalf("Queues with a cancelled context: %v, want context.Canceled", err)
		}
	})

	t.Run("ChunkBelowOneThousandIsRefused", func(t *testing.T) {
		t.Parallel()
		if _, err := NewIDLister(nil, WithPageSize(10)); !errors.Is(err, queue.ErrBadOption) {
			t.Fatalf("NewIDLister(WithPageSize(10)): %v, want queue.ErrBadOption", err)
		}
	})
}

// Both listers return the same IDs for a queue of 2,500 active tasks
// (three chunks, three Inspector pages).
func TestIDListerAgreesWithTheInspectorOverManyChunks(t *testing.T) {
	t.Parallel()
	b := setupLister(t)
	t.Cleanup(func() { _ = queuetest.Remove(context.Background(), b.rc, b.queue) })
	want := make([]string, 2500)
	for i := range want {
		want[i] = fmt.Sprintf("%s-%05d", b.queue, i)
	}
	if err := queuetest.MakeActive(t.Context(), b.rc, b.queue, "report.export", want); err != nil {
		t.Fatal(err)
	}
	fromInspector, err := b.lister.ListActive(t.Context(), b.queue)
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(fromInspector.IDs)
	l, err := NewIDLister(b.rc)
	if err != nil {
		t.Fatal(err)
	}
	got, err := l.ListActive(t.Context(), b.queue)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got.IDs, want) || !slices.Equal(fromInspector.IDs, want) || got.EmptyIDs != 0 || fromInspector.EmptyIDs != 0 {
		t.Fatalf("ID lister listed %d, Inspector lister %d (empty %d, %d); want the same %d IDs",
			len(got.IDs), len(fromInspector.IDs), got.EmptyIDs, fromInspector.EmptyIDs, len(want))
	}
}

// An active entry whose task hash is there but that has no lease (asynq
// never recovers it) is named in NoLease and left out of IDs.
func TestIDListerNamesActiveEntriesWithoutALease(t *testing.T) {
	t.Parallel()
	b := setupLister(t)
	b.runActive(t, "leased", "unleased")
	lease := "asynq:{" + b.queue + "}:lease"
	if n, err := b.rc.ZRem(t.Context(), lease, "unleased").Result(); err != nil || n != 1 {
		t.Fatalf("removing the lease: %d, %v", n, err)
	}
	l, err := NewIDLister(b.rc)
	if err != nil {
		t.Fatal(err)
	}
	got, err := l.ListActive(t.Context(), b.queue)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got.IDs, []string{"leased"}) || !slices.Equal(got.NoLease, []string{"unleased"}) || got.EmptyIDs != 0 {
		t.Fatalf("ListActive = %+v; want IDs [leased], NoLease [unleased]", got)
	}
}
