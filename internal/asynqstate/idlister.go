package asynqstate

import (
	"cmp"
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
// empty ID) and which have no lease (asynq never recovers those). It is
// the exact check, entry by entry (2.7 to 4.2 microseconds of Redis time
// per entry), which StreamActive runs only on the chunks of a queue whose
// lease set and active list differ in size. All keys share the queue's
// hash tag, as in asynq's own scripts, so it runs on Redis Cluster too.
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
// directly: chunks of IDs, read in rounds of a few pipelines (see
// StreamActive), with no payload decoded (the Inspector ships and decodes
// every task and every expired lease on every page: measured 895 ms
// against 35 ms for 100,000 active tasks). TaskStatus, used for the few
// lost-task candidates of a pass, goes through asynq's Inspector.
//
// It depends on asynq's key layout (asynq:queues, asynq:{<queue>}:active,
// asynq:{<queue>}:t:<id>, asynq:{<queue>}:lease); TestIDListerKeyLayout
// holds it to the asynq version in go.mod.
type IDLister struct {
	client    redis.UniversalClient
	inspector *InspectorLister
	chunk     int
}

// NewIDLister returns an IDLister over client, reading chunks of
// ListPageSizeDefault IDs; WithPageSize sets the chunk size, with the same
// minimum as for the Inspector lister. Build client with
// ContextTimeoutEnabled: true so that ctx's deadline bounds each pipeline.
// It returns an error wrapping queue.ErrBadOption when an option's value breaks
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
		return nil, fmt.Errorf("asynqstate.IDLister.Queues: %w", err)
	}
	slices.Sort(qs)
	return qs, nil
}

// ActiveChunk is part of one queue's active list, as StreamActive hands it
// over: IDs, Broken and NoLease as in ActiveTasks but for this chunk only
// (in list order, not sorted, an ID possibly again in a later chunk).
type ActiveChunk struct {
	// Queue is the queue the chunk belongs to.
	Queue string
	ActiveTasks
	// Done is true on the queue's last chunk: its listing is complete.
	Done bool
	// Err is set when listing the queue failed; no chunk of the queue
	// follows, and Done is false. Chunks handed over before it stay valid
	// (each was read and checked in one step).
	Err error
}

// streamRoundChunks bounds how many chunks one pipeline of StreamActive
// reads, so that the caller gets the first IDs while Redis still checks
// the rest (10 chunks of 1,000: a few milliseconds of Redis time).
const streamRoundChunks = 10

// recheckScript checks again, in one step, the entries one LRANGE read
// of a queue whose lease set and active list were the same size, after
// one EXISTS counted fewer task hashes than entries. An entry whose hash
// is there stays; one whose hash is gone is broken while it still holds
// its lease (asynq takes the entry, its lease and, unless the task is
// retained, its hash away in one step, and keeps one lease per entry),
// and has finished otherwise. It checks the entries as read, not the
// list's range again: the list moves meanwhile (new tasks at its head),
// and a range read again would lose the entries pushed out of it into a
// chunk already read.
//
// KEYS[1] lease set; ARGV[1] task key prefix; ARGV[2...] the entries as
// read. Returns {ids, gone, {}} as listChunkScript does: the entries that
// did not finish in read order, and those among them whose hash is gone.
var recheckScript = redis.NewScript(`
local ids = {}
local gone = {}
for i = 2, #ARGV do
  local id = ARGV[i]
  if redis.call("EXISTS", ARGV[1] .. id) == 1 then
    ids[#ids + 1] = id
  elseif redis.call("ZSCORE", KEYS[1], id) then
    ids[#ids + 1] = id
    gone[#gone + 1] = id
  end
end
return {ids, gone, {}}
`)

// sizesScript returns, in one step, the length of a queue's active list
// and the size of its lease set. KEYS[1] active list; KEYS[2] lease set.
var sizesScript = redis.NewScript(`return {redis.call("LLEN", KEYS[1]), redis.call("ZCARD", KEYS[2])}`)

// chunkRead is one chunk a round of StreamActive reads.
type chunkRead struct {
	queue string
	start int
	first bool
	known *redis.BoolCmd
	sizes *redis.Cmd
	// The fast read: the chunk's entries and how many of their task
	// hashes exist.
	ids    *redis.StringSliceCmd
	exists *redis.IntCmd
	// The exact read, by listChunkScript, of every chunk of a queue whose
	// lease set and active list differ in size.
	reply *redis.Cmd
	// The check again, by recheckScript, of the entries of a chunk the
	// fast read found an entry without a task hash in.
	recheck *redis.Cmd
}

// StreamActive reads the active lists of queues and calls fn with each
// chunk, in order within a queue, as the pipelines come back: the first
// chunk of every queue (with whether asynq knows the queue and the list's
// length) in one round, then the rest in rounds of at most
// streamRoundChunks chunks. A caller can so load the rows of one part
// while Redis checks the next, and a pass over many small queues costs
// few round trips. When a queue's last chunk comes back full (the list
// grew), it reads on until a chunk is short.
//
// Each entry is checked for its task hash and its lease (see
// ActiveTasks), at a fraction of the Redis time of checking each entry in
// a script (measured on Redis 7.0: 0.15 against 2.7 to 4.2 microseconds per
// entry):
//   - Leases: asynq keeps a queue's lease set equal to its active list
//     (every script that adds or removes an entry does the same to its
//     lease, and a lease is only ever extended with ZADD XX). So when the
//     list's length and the lease set's size, read in one step with the
//     first chunk, are equal, no entry lacks a lease and none is checked;
//     when they differ, every chunk of the queue is read and checked
//     entry by entry by listChunkScript. (Equal sizes could hide an entry
//     without a lease only behind a lease without an entry, which asynq
//     never writes.)
//   - Task hashes: a round reads its chunks (LRANGE), then counts their
//     task hashes with one EXISTS per chunk. The entries of a chunk with a
//     hash missing are checked again in one step by recheckScript: an
//     entry whose hash is gone and that still holds its lease is broken;
//     one that finished between the read and the count has no lease any
//     more and is dropped, never reported as broken. The entries are
//     checked as read, not the list's range read again, so that a task
//     pushed out of the range meanwhile (new tasks enter at the list's
//     head) is not lost to a chunk read before.
//
// Every queue ends with exactly one call whose Done is true, or one whose
// Err is set (a Redis error or ctx's, naming the queue); a queue asynq
// never saw ends with one chunk whose NotFound is true. fn runs on the
// caller's goroutine.
func (l *IDLister) StreamActive(ctx context.Context, queues []string, fn func(ActiveChunk)) {
	var round []*chunkRead
	for _, q := range queues {
		round = append(round, &chunkRead{queue: q, first: true})
	}
	length := make(map[string]int, len(queues))
	failed := map[string]bool{}
	// exact names the queues whose lease set and active list differ in
	// size: their chunks are checked entry by entry.
	exact := map[string]bool{}
	for {
		round = slices.DeleteFunc(round, func(c *chunkRead) bool { return failed[c.queue] })
		if len(round) == 0 {
			return
		}
		var next []*chunkRead
		now := round[:min(len(round), max(streamRoundChunks, countFirst(round)))]
		rest := round[len(now):]
		l.readRound(ctx, now, exact)
		for _, c := range now {
			if failed[c.queue] {
				continue
			}
			fail := func(err error) {
				failed[c.queue] = true
				fn(ActiveChunk{Queue: c.queue, Err: fmt.Errorf("asynqstate.IDLister.ListActive: queue %q: %w", c.queue, err)})
			}
			if c.first {
				if err := cmp.Or(c.known.Err(), c.sizes.Err()); err != nil {
					fail(err)
					continue
				}
				if !c.known.Val() {
					fn(ActiveChunk{Queue: c.queue, ActiveTasks: ActiveTasks{NotFound: true}, Done: true})
					continue
				}
				length[c.queue] = sizesOf(c.sizes)[0]
			}
			ids, gone, noLease, read, err := c.result()
			if err != nil {
				fail(err)
				continue
			}
			chunk := ActiveChunk{Queue: c.queue, ActiveTasks: ActiveTasks{
				IDs: withoutBroken(withoutBroken(ids, gone), noLease), EmptyIDs: len(gone), Broken: gone, NoLease: noLease,
			}}
			// The chunks still to read after this one: those the length
			// calls for, then one more whenever the last comes back full.
			end := c.start + l.chunk
			switch {
			case c.first && length[c.queue] > end:
				for s := end; s < length[c.queue]; s += l.chunk {
					next = append(next, &chunkRead{queue: c.queue, start: s})
				}
			case end >= length[c.queue] && read == l.chunk:
				length[c.queue] = end + 1
				next = append(next, &chunkRead{queue: c.queue, start: end})
			case end >= length[c.queue]:
				chunk.Done = true
			}
			fn(chunk)
		}
		round = append(rest, next...)
	}
}

// readRound reads and checks the chunks of one round: a pipeline of
// LRANGEs (for a queue's first chunk also SISMEMBER and sizesScript; for a
// queue in exact, listChunkScript); then it adds to exact each queue whose
// first chunk's sizes differ; a pipeline of one EXISTS per chunk read by
// LRANGE (listChunkScript instead for a queue in exact), and, only for the
// chunks whose EXISTS counted fewer hashes than entries, a pipeline of
// recheckScript. Each command carries its own error (a connection error,
// all of them), which chunkRead.result reports: a failing chunk fails only
// its queue.
func (l *IDLister) readRound(ctx context.Context, round []*chunkRead, exact map[string]bool) {
	script := func(p redis.Pipeliner, c *chunkRead) {
		c.reply = listChunkScript.Eval(ctx, p, []string{asynqActiveKey(c.queue), asynqLeaseKey(c.queue)},
			c.start, c.start+l.chunk-1, asynqTaskKeyPrefix(c.queue))
	}
	_, _ = l.client.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, c := range round {
			active := asynqActiveKey(c.queue)
			if c.first {
				c.known = p.SIsMember(ctx, asynqQueuesKey, c.queue)
				c.sizes = sizesScript.Eval(ctx, p, []string{active, asynqLeaseKey(c.queue)})
			}
			if exact[c.queue] {
				script(p, c)
				continue
			}
			c.ids = p.LRange(ctx, active, int64(c.start), int64(c.start+l.chunk-1))
		}
		return nil
	})
	for _, c := range round {
		if c.first && c.sizes.Err() == nil {
			if sz := sizesOf(c.sizes); sz[0] != sz[1] {
				exact[c.queue] = true
			}
		}
	}
	_, _ = l.client.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, c := range round {
			if c.reply != nil || c.ids.Err() != nil || len(c.ids.Val()) == 0 {
				continue
			}
			if exact[c.queue] {
				script(p, c)
				continue
			}
			prefix := asynqTaskKeyPrefix(c.queue)
			keys := make([]string, len(c.ids.Val()))
			for i, id := range c.ids.Val() {
				keys[i] = prefix + id
			}
			c.exists = p.Exists(ctx, keys...)
		}
		return nil
	})
	_, _ = l.client.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, c := range round {
			if c.exists != nil && c.exists.Err() == nil && c.exists.Val() != int64(len(c.ids.Val())) {
				args := make([]any, 0, 1+len(c.ids.Val()))
				args = append(args, asynqTaskKeyPrefix(c.queue))
				for _, id := range c.ids.Val() {
					args = append(args, id)
				}
				c.recheck = recheckScript.Eval(ctx, p, []string{asynqLeaseKey(c.queue)}, args...)
			}
		}
		return nil
	})
}

// sizesOf decodes sizesScript's {list length, lease set size}; a reply of
// another shape reads as two different sizes, so that the queue is
// checked entry by entry.
func sizesOf(c *redis.Cmd) [2]int {
	v, _ := c.Int64Slice()
	if len(v) != 2 {
		return [2]int{0, -1}
	}
	return [2]int{int(v[0]), int(v[1])}
}

// result returns what c's reads found: the chunk's entries in list order,
// those whose task hash is missing, those whose hash is there but that
// have no lease, and how many entries the chunk's read returned (the
// entries of a full chunk, also when some of them finished before they
// were checked); or the error of the first read that failed.
func (c *chunkRead) result() (ids, gone, noLease []string, read int, err error) {
	if c.reply != nil { // listChunkScript read the chunk
		ids, gone, noLease, err = chunkReply(c.reply)
		return ids, gone, noLease, len(ids), err
	}
	if err := c.ids.Err(); err != nil {
		return nil, nil, nil, 0, err
	}
	if c.exists != nil && c.exists.Err() != nil {
		return nil, nil, nil, 0, c.exists.Err()
	}
	if c.recheck != nil { // recheckScript checked the entries LRANGE read
		ids, gone, noLease, err = chunkReply(c.recheck)
		return ids, gone, noLease, len(c.ids.Val()), err
	}
	return c.ids.Val(), nil, nil, len(c.ids.Val()), nil
}

// countFirst counts the first chunks at the head of round, which are read
// together in the first pipeline whatever their number.
func countFirst(round []*chunkRead) int {
	n := 0
	for n < len(round) && round[n].first {
		n++
	}
	return n
}

// ListActive reads queue's active list with StreamActive and returns it
// whole. IDs are returned sorted, each once; entries whose task hash is
// gone are counted in EmptyIDs (as the Inspector counts them) and named in
// Broken; entries without a lease are named in NoLease; neither kind is in
// IDs.
//
// The list can move between two rounds (asynq pushes new tasks at its
// head and takes finished ones out wherever they are), so an entry may be
// read twice (IDs holds it once) or, when tasks before it finish, missed;
// it is seen again by the next pass.
//
// It returns ActiveTasks{NotFound: true}, nil when asynq never saw queue.
// Errors, each naming the queue: ctx's error; any Redis error, wrapped.
func (l *IDLister) ListActive(ctx context.Context, queue string) (ActiveTasks, error) {
	var (
		out ActiveTasks
		err error
	)
	l.StreamActive(ctx, []string{queue}, func(c ActiveChunk) {
		if c.Err != nil {
			err = c.Err
			return
		}
		out.NotFound = c.NotFound
		out.IDs = append(out.IDs, c.IDs...)
		out.EmptyIDs += c.EmptyIDs
		out.Broken = append(out.Broken, c.Broken...)
		out.NoLease = append(out.NoLease, c.NoLease...)
	})
	if err != nil {
		return ActiveTasks{}, err
	}
	slices.Sort(out.NoLease)
	out.NoLease = slices.Compact(out.NoLease)
	slices.Sort(out.IDs)
	out.IDs = slices.Compact(out.IDs)
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
