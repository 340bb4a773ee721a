package asynqstate

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"
)

// laterChunkRead matches the first pipeline reading a chunk past a
// queue's first (by LRANGE, or by listChunkScript, whose ARGV[1] is the
// chunk's first index).
func laterChunkRead(cmds []redis.Cmder) bool {
	return slices.ContainsFunc(cmds, func(c redis.Cmder) bool {
		a := c.Args()
		switch strings.ToLower(c.Name()) {
		case "lrange":
			return fmt.Sprint(a[2]) != "0"
		case "eval", "evalsha":
			return len(a) > 5 && fmt.Sprint(a[5]) != "0"
		}
		return false
	})
}

// A task that stays active through the whole listing is listed, also when
// another task of its chunk finishes and new tasks start between the read
// of the chunk and the count of its hashes. The per-entry script, read
// chunk by chunk in list order, lists it: the new tasks push it towards
// the tail, into a chunk read later.
func TestStreamActiveListsATaskThatStaysActiveWhileItsChunkIsReadAgain(t *testing.T) {
	t.Parallel()
	mr, rc := miniRedis(t)
	ctx := t.Context()
	q := "moving"
	var entries []activeEntry
	for _, id := range []string{"a", "b", "c", "d", "e", "f"} {
		entries = append(entries, activeEntry{id: id, hash: true, lease: true})
	}
	writeQueue(t, ctx, rc, q, entries)
	// Chunks of 2: {a b} in the first round; {c d} and {e f} read together
	// in the second. Between that read and the count, c finishes and n1,
	// n2 start (as asynq's dequeue starts them: pushed at the list's head,
	// with hash and lease).
	hook := &onceAfter{match: laterChunkRead, then: func(ctx context.Context) error {
		if err := finish(ctx, rc, q, "c"); err != nil {
			return err
		}
		_, err := rc.TxPipelined(ctx, func(p redis.Pipeliner) error {
			for _, id := range []string{"n1", "n2"} {
				p.LPush(ctx, asynqActiveKey(q), id)
				p.HSet(ctx, asynqTaskKeyPrefix(q)+id, "state", "active")
				p.ZAdd(ctx, asynqLeaseKey(q), redis.Z{Score: 1764590000, Member: id})
			}
			return nil
		})
		return err
	}}
	got, err := (&IDLister{client: hookedClient(t, mr, hook), chunk: 2}).ListActive(ctx, q)
	if err != nil {
		t.Fatal(err)
	}
	if !hook.fired {
		t.Fatal("the list never moved")
	}
	for _, id := range []string{"a", "b", "d", "e", "f"} {
		if _, ok := slices.BinarySearch(got.IDs, id); !ok {
			t.Errorf("ListActive = IDs %v, Broken %v, NoLease %v: task %s, active throughout, is missing",
				got.IDs, got.Broken, got.NoLease, id)
		}
	}
}

// A check of a chunk's entries that fails ends that queue with one error
// and no Done; the other queue of the same round is listed to its end.
func TestStreamActiveFailingRecheckFailsOnlyItsQueue(t *testing.T) {
	t.Parallel()
	mr, rc := miniRedis(t)
	ctx := t.Context()
	writeQueue(t, ctx, rc, "bad", []activeEntry{{id: "a1", hash: true, lease: true}, {id: "a2", lease: true}})
	writeQueue(t, ctx, rc, "good", []activeEntry{{id: "b1", hash: true, lease: true}, {id: "b2", hash: true, lease: true}})
	// Right after the count of the hashes, queue bad's lease set turns
	// into a string, so that the check of its entries that follows fails.
	hook := &onceAfter{match: holding("exists"), then: func(ctx context.Context) error {
		return rc.Set(ctx, asynqLeaseKey("bad"), "not a sorted set", 0).Err()
	}}
	ends := map[string][]string{}
	got := map[string][]string{}
	(&IDLister{client: hookedClient(t, mr, hook), chunk: 1000}).StreamActive(ctx, []string{"bad", "good"}, func(c ActiveChunk) {
		got[c.Queue] = append(got[c.Queue], c.IDs...)
		switch {
		case c.Err != nil:
			ends[c.Queue] = append(ends[c.Queue], "err: "+c.Err.Error())
		case c.Done:
			ends[c.Queue] = append(ends[c.Queue], "done")
		}
	})
	if !hook.fired {
		t.Fatal("the lease set was never broken")
	}
	if len(ends["bad"]) != 1 || !strings.Contains(ends["bad"][0], "WRONGTYPE") || len(got["bad"]) != 0 {
		t.Errorf("queue bad ended %v with IDs %v; want one WRONGTYPE error and no IDs", ends["bad"], got["bad"])
	}
	if !slices.Equal(ends["good"], []string{"done"}) || !slices.Equal(got["good"], []string{"b1", "b2"}) {
		t.Errorf("queue good ended %v with IDs %v; want done with [b1 b2]", ends["good"], got["good"])
	}
}
