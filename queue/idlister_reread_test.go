package queue

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"
)

// moveAfterLaterRead is a go-redis hook that, once, right after the first
// pipeline reading a chunk past a queue's first returns, finishes
// task done (as asynq's done script does) and starts tasks started (as
// its dequeue does: pushed at the list's head, with hash and lease): the
// list moves between the read of a round's chunks and the count of their
// hashes.
type moveAfterLaterRead struct {
	rc      *redis.Client
	q       string
	done    string
	started []string
	moved   bool
}

func (h *moveAfterLaterRead) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (h *moveAfterLaterRead) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (h *moveAfterLaterRead) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		later := slices.ContainsFunc(cmds, func(c redis.Cmder) bool {
			a := c.Args()
			switch strings.ToLower(c.Name()) {
			case "lrange":
				return fmt.Sprint(a[2]) != "0"
			case "eval", "evalsha": // listChunkScript: ARGV[1] is the first index
				return len(a) > 5 && fmt.Sprint(a[5]) != "0"
			}
			return false
		})
		if h.moved || !later {
			return err
		}
		h.moved = true
		_, ferr := h.rc.TxPipelined(ctx, func(p redis.Pipeliner) error {
			p.LRem(ctx, asynqActiveKey(h.q), 0, h.done)
			p.ZRem(ctx, asynqLeaseKey(h.q), h.done)
			p.Del(ctx, asynqTaskKeyPrefix(h.q)+h.done)
			for _, id := range h.started {
				p.LPush(ctx, asynqActiveKey(h.q), id)
				p.HSet(ctx, asynqTaskKeyPrefix(h.q)+id, "state", "active")
				p.ZAdd(ctx, asynqLeaseKey(h.q), redis.Z{Score: 1764590000, Member: id})
			}
			return nil
		})
		if ferr != nil {
			return ferr
		}
		return err
	}
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
	hooked := redis.NewClient(&redis.Options{Addr: mr.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = hooked.Close() })
	// Chunks of 2: {a b} in the first round; {c d} and {e f} read together
	// in the second. Between that read and the count, c finishes and n1,
	// n2 start.
	hook := &moveAfterLaterRead{rc: rc, q: q, done: "c", started: []string{"n1", "n2"}}
	hooked.AddHook(hook)
	got, err := (&IDLister{client: hooked, chunk: 2}).ListActive(ctx, q)
	if err != nil {
		t.Fatal(err)
	}
	if !hook.moved {
		t.Fatal("the list never moved")
	}
	for _, id := range []string{"a", "b", "d", "e", "f"} {
		if _, ok := slices.BinarySearch(got.IDs, id); !ok {
			t.Errorf("ListActive = IDs %v, Broken %v, NoLease %v: task %s, active throughout, is missing",
				got.IDs, got.Broken, got.NoLease, id)
		}
	}
}

// breakLeaseAfterCount is a go-redis hook that, once, right after the
// first pipeline holding an EXISTS returns, turns queue q's lease set into
// a string, so that the check of q's entries that follows fails.
type breakLeaseAfterCount struct {
	rc    *redis.Client
	q     string
	fired bool
}

func (h *breakLeaseAfterCount) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (h *breakLeaseAfterCount) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (h *breakLeaseAfterCount) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		if h.fired || !slices.ContainsFunc(cmds, func(c redis.Cmder) bool { return strings.EqualFold(c.Name(), "exists") }) {
			return err
		}
		h.fired = true
		if ferr := h.rc.Set(ctx, asynqLeaseKey(h.q), "not a sorted set", 0).Err(); ferr != nil {
			return ferr
		}
		return err
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
	hooked := redis.NewClient(&redis.Options{Addr: mr.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = hooked.Close() })
	hook := &breakLeaseAfterCount{rc: rc, q: "bad"}
	hooked.AddHook(hook)
	ends := map[string][]string{}
	got := map[string][]string{}
	(&IDLister{client: hooked, chunk: 1000}).StreamActive(ctx, []string{"bad", "good"}, func(c ActiveChunk) {
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
