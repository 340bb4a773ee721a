package asynqstate

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/jobreaper/jobreaper/queue/queuetest"
)

// StreamActive over many queues hands every queue's entries over in
// chunks and ends each queue exactly once: Done for a listed queue (also
// an unknown one, with NotFound), Err for one whose list cannot be read,
// without stopping the others.
func TestStreamActiveEndsEveryQueueOnceAndIsolatesAFailingQueue(t *testing.T) {
	t.Parallel()
	rc := realRedis(t)
	ctx := t.Context()
	prefix := unique(t, "stream-")
	sizes := map[string]int{prefix + "-a": 7, prefix + "-b": 0, prefix + "-c": 23}
	want := map[string][]string{}
	for q, n := range sizes {
		t.Cleanup(func() { _ = queuetest.Remove(context.Background(), rc, q) })
		for i := range n {
			want[q] = append(want[q], fmt.Sprintf("%s-%03d", q, i))
		}
		if err := queuetest.MakeActive(ctx, rc, q, "report.export", want[q]); err != nil {
			t.Fatal(err)
		}
	}
	// A queue asynq knows whose active list is not a list: reading it
	// fails with WRONGTYPE. Queue b is known and has nothing active.
	broken := prefix + "-wrongtype"
	t.Cleanup(func() { _ = queuetest.Remove(context.Background(), rc, broken) })
	if err := rc.SAdd(ctx, asynqQueuesKey, broken, prefix+"-b").Err(); err != nil {
		t.Fatal(err)
	}
	if err := rc.Set(ctx, asynqActiveKey(broken), "not a list", 0).Err(); err != nil {
		t.Fatal(err)
	}
	unknown := prefix + "-never-seen"
	queues := []string{prefix + "-a", broken, prefix + "-b", unknown, prefix + "-c"}

	// Chunks of 5 over lists of 7 and 23: several rounds, and queue c's
	// chunks span more than one pipeline.
	l := &IDLister{client: rc, chunk: 5}
	got := map[string][]string{}
	ends := map[string][]string{}
	l.StreamActive(ctx, queues, func(c ActiveChunk) {
		if len(ends[c.Queue]) > 0 {
			t.Errorf("queue %s: chunk after its end (%v)", c.Queue, ends[c.Queue])
		}
		got[c.Queue] = append(got[c.Queue], c.IDs...)
		switch {
		case c.Err != nil:
			ends[c.Queue] = append(ends[c.Queue], "err: "+c.Err.Error())
		case c.NotFound:
			ends[c.Queue] = append(ends[c.Queue], "not found")
		case c.Done:
			ends[c.Queue] = append(ends[c.Queue], "done")
		}
	})
	for _, q := range []string{prefix + "-a", prefix + "-b", prefix + "-c"} {
		slices.Sort(got[q])
		if !slices.Equal(got[q], want[q]) {
			t.Errorf("queue %s: streamed %v, want %v", q, got[q], want[q])
		}
		if !slices.Equal(ends[q], []string{"done"}) {
			t.Errorf("queue %s ended %v, want once with done", q, ends[q])
		}
	}
	if !slices.Equal(ends[unknown], []string{"not found"}) || len(got[unknown]) != 0 {
		t.Errorf("unknown queue ended %v with %v, want once, not found, no IDs", ends[unknown], got[unknown])
	}
	if len(ends[broken]) != 1 || !strings.HasPrefix(ends[broken][0], "err: ") || !strings.Contains(ends[broken][0], broken) ||
		!strings.Contains(ends[broken][0], "WRONGTYPE") {
		t.Errorf("failing queue ended %v, want one error naming the queue and WRONGTYPE", ends[broken])
	}
}

// A list that grows while it is read (its last chunk comes back full) is
// read on until a chunk is short.
func TestStreamActiveReadsOnWhenTheLastChunkIsFull(t *testing.T) {
	t.Parallel()
	rc := realRedis(t)
	ctx := t.Context()
	q := unique(t, "grow-")
	t.Cleanup(func() { _ = queuetest.Remove(context.Background(), rc, q) })
	var ids []string
	for i := range 10 {
		ids = append(ids, fmt.Sprintf("g-%02d", i))
	}
	if err := queuetest.MakeActive(ctx, rc, q, "report.export", ids); err != nil {
		t.Fatal(err)
	}
	// The list holds 4 entries when it is first read; the other 6 (with
	// their hashes and leases) come back at its tail after the first
	// chunk, as if the list had grown there.
	all, err := rc.LRange(ctx, asynqActiveKey(q), 0, -1).Result()
	if err != nil || len(all) != 10 {
		t.Fatalf("active list: %v, %v", all, err)
	}
	if err := rc.LTrim(ctx, asynqActiveKey(q), 0, 3).Err(); err != nil {
		t.Fatal(err)
	}
	l := &IDLister{client: rc, chunk: 4}
	var got []string
	first := true
	l.StreamActive(ctx, []string{q}, func(c ActiveChunk) {
		got = append(got, c.IDs...)
		if first {
			// LLEN said 4, the chunk came back full: six more arrive
			// before the next round.
			first = false
			if err := rc.RPush(ctx, asynqActiveKey(q), toAny(all[4:])...).Err(); err != nil {
				t.Error(err)
			}
		}
	})
	slices.Sort(got)
	if !slices.Equal(got, ids) {
		t.Fatalf("streamed %v, want all of %v", got, ids)
	}
}

func toAny(s []string) []any {
	out := make([]any, len(s))
	for i, v := range s {
		out[i] = v
	}
	return out
}
