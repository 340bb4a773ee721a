package asynqstate

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"pgregory.net/rapid"
)

// activeEntry is one entry of a generated active list.
type activeEntry struct {
	id    string
	hash  bool // the task hash exists
	lease bool // the ID is in the lease set
	twice bool // the ID is in the list twice
}

// writeQueue writes entries as asynq's keys of queue q (the list in
// order, each hash and lease as flagged) directly, as a data loss would
// leave them.
func writeQueue(t interface{ Fatal(...any) }, ctx context.Context, rc *redis.Client, q string, entries []activeEntry) {
	if err := rc.SAdd(ctx, asynqQueuesKey, q).Err(); err != nil {
		t.Fatal(err)
	}
	var list []string
	for _, e := range entries {
		list = append(list, e.id)
		if e.twice {
			list = append(list, e.id)
		}
		if e.hash {
			if err := rc.HSet(ctx, asynqTaskKeyPrefix(q)+e.id, "state", "active").Err(); err != nil {
				t.Fatal(err)
			}
		}
		if e.lease {
			if err := rc.ZAdd(ctx, asynqLeaseKey(q), redis.Z{Score: 1764590000, Member: e.id}).Err(); err != nil {
				t.Fatal(err)
			}
		}
	}
	if len(list) > 0 {
		if err := rc.RPush(ctx, asynqActiveKey(q), toAny(list)...).Err(); err != nil {
			t.Fatal(err)
		}
	}
}

// The cheap checks (a size comparison for leases, one EXISTS per chunk
// for task hashes, the script only where they find something) list
// exactly what checking every entry finds, for any mix of entries without
// a hash, without a lease or listed twice (asynq never writes a lease
// without an entry, so none is generated), and any chunk size.
func TestStreamActiveChecksFindWhatAnEntryByEntryCheckFinds(t *testing.T) {
	t.Parallel()
	_, rc := miniRedis(t)
	n := 0
	rapid.Check(t, func(t *rapid.T) {
		ctx := context.Background()
		n++
		q := fmt.Sprintf("check-%d", n)
		entries := rapid.SliceOfN(rapid.Custom(func(t *rapid.T) activeEntry {
			return activeEntry{
				hash:  rapid.IntRange(0, 9).Draw(t, "hash") > 1,
				lease: rapid.IntRange(0, 9).Draw(t, "lease") > 1,
				twice: rapid.IntRange(0, 9).Draw(t, "twice") == 0,
			}
		}), 0, 40).Draw(t, "entries")
		for i := range entries {
			entries[i].id = fmt.Sprintf("J%02d", i)
		}
		chunk := rapid.SampledFrom([]int{1, 2, 3, 7, 1000}).Draw(t, "chunk")
		writeQueue(t, ctx, rc, q, entries)

		var wantIDs, wantBroken, wantNoLease []string
		wantEmpty := 0
		for _, e := range entries {
			switch {
			case !e.hash:
				wantBroken = append(wantBroken, e.id)
				wantEmpty++
				if e.twice {
					wantEmpty++
				}
			case !e.lease:
				wantNoLease = append(wantNoLease, e.id)
			default:
				wantIDs = append(wantIDs, e.id)
			}
		}
		l := &IDLister{client: rc, chunk: chunk}
		got, err := l.ListActive(ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got.IDs, wantIDs) || !slices.Equal(got.Broken, wantBroken) || !slices.Equal(got.NoLease, wantNoLease) ||
			got.EmptyIDs != wantEmpty || got.NotFound {
			t.Fatalf("chunk %d: ListActive = IDs %v, Broken %v, NoLease %v, EmptyIDs %d; want %v, %v, %v, %d",
				chunk, got.IDs, got.Broken, got.NoLease, got.EmptyIDs, wantIDs, wantBroken, wantNoLease, wantEmpty)
		}
	})
}

// onceAfter is a go-redis hook that, once, right after the first
// pipeline for which match is true returns, runs then: it changes asynq's
// keys between two pipelines of a listing, as a worker running meanwhile
// would.
type onceAfter struct {
	match func(cmds []redis.Cmder) bool
	then  func(ctx context.Context) error
	fired bool
}

func (h *onceAfter) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (h *onceAfter) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (h *onceAfter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		if h.fired || !h.match(cmds) {
			return err
		}
		h.fired = true
		if ferr := h.then(ctx); ferr != nil {
			return ferr
		}
		return err
	}
}

// holding returns a match for a pipeline holding a command named name.
func holding(name string) func([]redis.Cmder) bool {
	return func(cmds []redis.Cmder) bool {
		return slices.ContainsFunc(cmds, func(c redis.Cmder) bool { return strings.EqualFold(c.Name(), name) })
	}
}

// hookedClient returns a second client of mr with hook, closed at cleanup.
func hookedClient(t *testing.T, mr *miniredis.Miniredis, hook redis.Hook) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: mr.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	c.AddHook(hook)
	return c
}

// finish finishes task id of queue q as asynq's done script does: list
// entry, lease and task hash removed in one step.
func finish(ctx context.Context, rc *redis.Client, q, id string) error {
	_, err := rc.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.LRem(ctx, asynqActiveKey(q), 0, id)
		p.ZRem(ctx, asynqLeaseKey(q), id)
		p.Del(ctx, asynqTaskKeyPrefix(q)+id)
		return nil
	})
	return err
}

// A task that finishes between the read of its chunk and the count of the
// chunk's hashes is not a broken entry: the count comes up short, the
// chunk is read again and checked in one step, and the finished task is
// simply no longer active.
func TestStreamActiveDoesNotReportATaskThatFinishedBetweenReadAndCheck(t *testing.T) {
	t.Parallel()
	for _, finished := range []string{"J1", "J2", "J3"} {
		t.Run(finished, func(t *testing.T) {
			t.Parallel()
			mr, rc := miniRedis(t)
			ctx := t.Context()
			q := "finish"
			writeQueue(t, ctx, rc, q, []activeEntry{{id: "J1", hash: true, lease: true}, {id: "J2", hash: true, lease: true}, {id: "J3", hash: true, lease: true}})
			// Between the read of the chunk and the count of its hashes.
			hook := &onceAfter{match: holding("lrange"), then: func(ctx context.Context) error { return finish(ctx, rc, q, finished) }}
			got, err := (&IDLister{client: hookedClient(t, mr, hook), chunk: 1000}).ListActive(ctx, q)
			if err != nil {
				t.Fatal(err)
			}
			want := slices.DeleteFunc([]string{"J1", "J2", "J3"}, func(id string) bool { return id == finished })
			if !hook.fired || !slices.Equal(got.IDs, want) || got.EmptyIDs != 0 || len(got.Broken) != 0 || len(got.NoLease) != 0 {
				t.Fatalf("ListActive = %+v (task finished after the read: %v); want IDs %v and no broken entry", got, hook.fired, want)
			}
		})
	}
}
