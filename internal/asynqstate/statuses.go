package asynqstate

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/jobreaper/jobreaper/internal/redisop"
	"github.com/jobreaper/jobreaper/queue"
)

// StatusChunk is how many task lookups StatusReader sends in one pipeline
// (asynq's Inspector pages by the same number).
const StatusChunk = 1000

// TaskRef names a task: its queue and ID (= the job ID).
type TaskRef struct {
	Queue, ID string
}

// asynq v0.26.0's key layout, as StatusReader reads it: the set of known
// queues, and each task's hash, whose "state" field holds where the task
// is. TestStatusReaderMatchesTheInspector holds it to the asynq in go.mod.
const asynqAllQueues = "asynq:queues"

func asynqTaskKey(queue, id string) string { return "asynq:{" + queue + "}:t:" + id }

// asynqStates maps the "state" field of an asynq task hash to a TaskStatus.
var asynqStates = map[string]TaskStatus{
	"active": TaskActive, "pending": TaskPending, "scheduled": TaskScheduled, "retry": TaskRetry,
	"aggregating": TaskAggregating, "archived": TaskArchived, "completed": TaskCompleted,
}

// StatusReader looks many tasks up at once, reading asynq's keys (never
// writing them) in pipelines of StatusChunk, and lists the queues live
// asynq servers serve. It is safe for concurrent use.
type StatusReader struct {
	client    redis.UniversalClient
	inspector *asynq.Inspector
	opTimeout time.Duration
}

// NewStatusReader returns a StatusReader over client (build it with
// ContextTimeoutEnabled: true), each pipeline bounded by opTimeout
// (queue.MarkerOpTimeoutDefault when not positive).
func NewStatusReader(client redis.UniversalClient, opTimeout time.Duration) *StatusReader {
	if opTimeout <= 0 {
		opTimeout = queue.MarkerOpTimeoutDefault
	}
	return &StatusReader{client: client, inspector: asynq.NewInspectorFromRedisClient(client), opTimeout: opTimeout}
}

// TaskStatuses returns where asynq holds each task of refs, in order:
// TaskQueueNotFound when asynq does not know the task's queue at all,
// TaskNotFound when the queue is known and the task is not, else the
// task's state. Each chunk of StatusChunk refs is one pipeline.
//
// Errors: a pipeline that failed or exceeded the timeout (wrapping
// context.DeadlineExceeded then), naming the operation; a task whose state
// this package does not know (a newer asynq), naming it, so that nothing is
// decided on a guess. No partial result is returned with an error.
func (s *StatusReader) TaskStatuses(ctx context.Context, refs []TaskRef) ([]TaskStatus, error) {
	out := make([]TaskStatus, 0, len(refs))
	for start := 0; start < len(refs); start += StatusChunk {
		chunk := refs[start:min(start+StatusChunk, len(refs))]
		got, err := s.chunk(ctx, chunk)
		if err != nil {
			return nil, err
		}
		out = append(out, got...)
	}
	return out, nil
}

func (s *StatusReader) chunk(ctx context.Context, refs []TaskRef) ([]TaskStatus, error) {
	ctx, done := redisop.Timeout(ctx, "asynqstate.StatusReader.TaskStatuses", s.opTimeout)
	queues := map[string]*redis.BoolCmd{}
	states := make([]*redis.StringCmd, len(refs))
	_, err := s.client.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, ref := range refs {
			if _, ok := queues[ref.Queue]; !ok {
				queues[ref.Queue] = p.SIsMember(ctx, asynqAllQueues, ref.Queue)
			}
			states[i] = p.HGet(ctx, asynqTaskKey(ref.Queue, ref.ID), "state")
		}
		return nil
	})
	// A missing task answers redis.Nil, which go-redis also returns as the
	// pipeline's error: only other errors fail the chunk.
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, done(err)
	}
	out := make([]TaskStatus, len(refs))
	for i, ref := range refs {
		known, err := queues[ref.Queue].Result()
		if err != nil {
			return nil, done(fmt.Errorf("queue %q: %w", ref.Queue, err))
		}
		if !known {
			out[i] = TaskQueueNotFound
			continue
		}
		state, err := states[i].Result()
		if errors.Is(err, redis.Nil) {
			out[i] = TaskNotFound
			continue
		}
		if err != nil {
			return nil, done(fmt.Errorf("queue %q task %q: %w", ref.Queue, ref.ID, err))
		}
		st, ok := asynqStates[state]
		if !ok {
			return nil, done(fmt.Errorf("queue %q task %q: unknown asynq task state %q", ref.Queue, ref.ID, state))
		}
		out[i] = st
	}
	return out, done(nil)
}

// LiveQueues returns the queues that at least one live asynq server
// serves, in the Redis the reader reads: asynq's server registry, where
// every running server (asynq.Server) writes, every 5 s, the queues it
// serves, expiring after twice that. Only servers in the "active" state
// count (a stopped one takes no new task). It goes through asynq's
// Inspector.Servers, which, as asynq's own code does, also drops expired
// entries from the registry. It returns a wrapped Redis error naming the
// operation.
func (s *StatusReader) LiveQueues(ctx context.Context) (map[string]bool, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("asynqstate.StatusReader.LiveQueues: %w", err)
	}
	servers, err := s.inspector.Servers()
	if err != nil {
		return nil, fmt.Errorf("asynqstate.StatusReader.LiveQueues: %w", err)
	}
	live := map[string]bool{}
	for _, srv := range servers {
		if srv.Status != "active" {
			continue
		}
		for q := range srv.Queues {
			live[q] = true
		}
	}
	return live, nil
}
