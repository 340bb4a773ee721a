package queue

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
)

// asynq's Redis key layout, as the ID-only lister reads it. It has been
// stable since asynq v0.22 and is what v0.26.0 (go.mod) writes; a test
// against the real asynq fails if a new version moves any of it.
const (
	// asynqQueuesKey is the set of every queue asynq knows.
	asynqQueuesKey = "asynq:queues"
)

// asynqActiveKey is the list of queue's active task IDs.
func asynqActiveKey(queue string) string { return "asynq:{" + queue + "}:active" }

// asynqTaskKeyPrefix starts the key of each task hash of queue: the hash
// of task ID is asynqTaskKeyPrefix(queue) + ID.
func asynqTaskKeyPrefix(queue string) string { return "asynq:{" + queue + "}:t:" }

// asynqLeaseKey is the sorted set of queue's active task IDs by the expiry
// of their lease; asynq's dequeue adds an ID to it in the same step that
// moves the ID to the active list, and every step that takes an ID off the
// list removes it.
func asynqLeaseKey(queue string) string { return "asynq:{" + queue + "}:lease" }

// listChunkScript reads one chunk of an active list and, in the same step,
// which of its IDs have no task hash any more (asynq lists those with an
// empty ID) and which have no lease (asynq never recovers those). All keys
// share the queue's hash tag, as in asynq's own scripts, so it runs on
// Redis Cluster too.
//
// KEYS[1] active list; KEYS[2] lease set; ARGV[1] first index; ARGV[2]
// last index; ARGV[3] task key prefix. Returns {ids, gone, noLease}: the
// chunk's entries in list order, the entries among them whose task hash is
// missing, and those whose hash is there but that have no lease.
var listChunkScript = redis.NewScript(`
local ids = redis.call("LRANGE", KEYS[1], ARGV[1], ARGV[2])
local gone = {}
local nolease = {}
for _, id in ipairs(ids) do
  if redis.call("EXISTS", ARGV[3] .. id) == 0 then
    gone[#gone + 1] = id
  elseif not redis.call("ZSCORE", KEYS[2], id) then
    nolease[#nolease + 1] = id
  end
end
return {ids, gone, nolease}
`)

// IDLister implements ActiveLister by reading asynq's active lists
// directly: chunks of IDs, all chunks of a queue in one pipeline, with no
// payload decoded (the Inspector ships and decodes every task and every
// expired lease on every page: measured 895 ms against 35 ms for 100,000
// active tasks). TaskStatus, used for the few lost-task candidates of a
// pass, goes through asynq's Inspector.
//
// It depends on asynq's key layout (asynq:queues, asynq:{<queue>}:active,
// asynq:{<queue>}:t:<id>); TestIDListerKeyLayout holds it to the asynq
// version in go.mod.
type IDLister struct {
	client    redis.UniversalClient
	inspector *InspectorLister
	chunk     int
}

// NewIDLister returns an IDLister over client, reading chunks of
// ListPageSizeDefault IDs; WithPageSize sets the chunk size, with the same
// minimum as for the Inspector lister. Build client with
// ContextTimeoutEnabled: true so that ctx's deadline bounds each pipeline.
// It returns an error wrapping ErrBadOption when an option's value breaks
// its rule.
func NewIDLister(client redis.UniversalClient, opts ...ListerOption) (*IDLister, error) {
	insp, err := NewInspectorLister(asynq.NewInspectorFromRedisClient(client), opts...)
	if err != nil {
		return nil, err
	}
	return &IDLister{client: client, inspector: insp, chunk: insp.pageSize}, nil
}

// Queues returns every queue asynq knows (the members of asynq:queues),
// sorted by name. Errors: a wrapped Redis error (or ctx's) naming the
// operation.
func (l *IDLister) Queues(ctx context.Context) ([]string, error) {
	qs, err := l.client.SMembers(ctx, asynqQueuesKey).Result()
	if err != nil {
		return nil, fmt.Errorf("queue.IDLister.Queues: %w", err)
	}
	slices.Sort(qs)
	return qs, nil
}

// ListActive reads queue's active list: first whether asynq knows the
// queue and the list's length, then every chunk in one pipeline, each chunk
// checking in the same script which of its IDs have lost their task hash.
// If the last chunk came back full (the list grew meanwhile), it reads on
// until a chunk is short. IDs are returned sorted, each once; entries
// whose task hash is gone are counted in EmptyIDs (as the Inspector
// counts them) and named in Broken; entries without a lease are named in
// NoLease; neither kind is in IDs.
//
// The list can move between two chunks (asynq pushes new tasks at its
// head), so a task that started or finished meanwhile may be missed; it is
// seen again by the next pass.
//
// It returns ActiveTasks{NotFound: true}, nil when asynq never saw queue.
// Errors, each naming the queue: ctx's error; any Redis error, wrapped.
func (l *IDLister) ListActive(ctx context.Context, queue string) (ActiveTasks, error) {
	fail := func(err error) (ActiveTasks, error) {
		return ActiveTasks{}, fmt.Errorf("queue.IDLister.ListActive: queue %q: %w", queue, err)
	}
	active, prefix := asynqActiveKey(queue), asynqTaskKeyPrefix(queue)
	var (
		known  *redis.BoolCmd
		length *redis.IntCmd
	)
	if _, err := l.client.Pipelined(ctx, func(p redis.Pipeliner) error {
		known = p.SIsMember(ctx, asynqQueuesKey, queue)
		length = p.LLen(ctx, active)
		return nil
	}); err != nil {
		return fail(err)
	}
	if !known.Val() {
		return ActiveTasks{NotFound: true}, nil
	}
	var out ActiveTasks
	n := int(length.Val())
	for start := 0; ; {
		// At least one chunk, so that a list that grew since LLEN is read.
		chunks := max(1, (n-start+l.chunk-1)/l.chunk)
		cmds := make([]*redis.Cmd, chunks)
		if _, err := l.client.Pipelined(ctx, func(p redis.Pipeliner) error {
			for i := range cmds {
				first := start + i*l.chunk
				cmds[i] = listChunkScript.Eval(ctx, p, []string{active, asynqLeaseKey(queue)}, first, first+l.chunk-1, prefix)
			}
			return nil
		}); err != nil {
			return fail(err)
		}
		full := false
		for _, c := range cmds {
			ids, gone, noLease, err := chunkReply(c)
			if err != nil {
				return fail(err)
			}
			out.IDs = append(out.IDs, ids...)
			out.Broken = append(out.Broken, gone...)
			out.NoLease = append(out.NoLease, noLease...)
			full = len(ids) == l.chunk
		}
		if !full {
			break
		}
		start += chunks * l.chunk
		n = start + l.chunk
	}
	out.IDs = withoutBroken(withoutBroken(out.IDs, out.Broken), out.NoLease)
	slices.Sort(out.NoLease)
	out.NoLease = slices.Compact(out.NoLease)
	slices.Sort(out.IDs)
	out.IDs = slices.Compact(out.IDs)
	out.EmptyIDs = len(out.Broken)
	slices.Sort(out.Broken)
	out.Broken = slices.Compact(out.Broken)
	return out, nil
}

// chunkReply decodes listChunkScript's {ids, gone, noLease}.
func chunkReply(c *redis.Cmd) (ids, gone, noLease []string, err error) {
	v, err := c.Slice()
	if err != nil {
		return nil, nil, nil, err
	}
	if len(v) != 3 {
		return nil, nil, nil, errors.New("unexpected reply of the list script")
	}
	if ids, err = stringSlice(v[0]); err == nil {
		if gone, err = stringSlice(v[1]); err == nil {
			noLease, err = stringSlice(v[2])
		}
	}
	return ids, gone, noLease, err
}

func stringSlice(v any) ([]string, error) {
	items, ok := v.([]any)
	if !ok {
		return nil, fmt.Errorf("unexpected reply %T of the list script", v)
	}
	out := make([]string, len(items))
	for i, it := range items {
		s, ok := it.(string)
		if !ok {
			return nil, fmt.Errorf("unexpected list entry %T", it)
		}
		out[i] = s
	}
	return out, nil
}

// withoutBroken drops from ids every entry listed in broken (few, usually
// none), in place.
func withoutBroken(ids, broken []string) []string {
	if len(broken) == 0 {
		return ids
	}
	gone := make(map[string]struct{}, len(broken))
	for _, id := range broken {
		gone[id] = struct{}{}
	}
	return slices.DeleteFunc(ids, func(id string) bool {
		_, ok := gone[id]
		return ok
	})
}

// TaskStatus looks task id of queue up with asynq's Inspector; see
// InspectorLister.TaskStatus.
func (l *IDLister) TaskStatus(ctx context.Context, queue, id string) (TaskStatus, error) {
	return l.inspector.TaskStatus(ctx, queue, id)
}
