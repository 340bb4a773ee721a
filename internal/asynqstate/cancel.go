package asynqstate

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/jobreaper/jobreaper/internal/redisop"
	"github.com/jobreaper/jobreaper/queue"
)

// CancelChannel is the Redis channel asynq's servers listen on for cancels
// of running handlers (asynq v0.26.0, internal/base: "asynq:cancel"; the
// Inspector's CancelProcessing publishes a task ID there). A server running
// the task cancels its handler's context; asynq then stops waiting for the
// handler at once, frees its worker slot and schedules a retry, which the
// start guard refuses for a reaped or cancelled job. A handler that ignores
// its context keeps running in the background until it returns.
const CancelChannel = "asynq:cancel"

// CancelChunk is how many cancels one pipeline carries: asynq's Inspector
// pages by 1,000, and a pipeline of that size is one round trip of a few
// kilobytes.
const CancelChunk = 1000

// Canceller publishes asynq's cancels of running handlers.
type Canceller struct {
	client    redis.UniversalClient
	opTimeout time.Duration
}

// NewCanceller returns a Canceller over client; each pipeline is bounded
// by opTimeout (0: queue.MarkerOpTimeoutDefault).
func NewCanceller(client redis.UniversalClient, opTimeout time.Duration) *Canceller {
	if opTimeout <= 0 {
		opTimeout = queue.MarkerOpTimeoutDefault
	}
	return &Canceller{client: client, opTimeout: opTimeout}
}

// Cancel publishes a cancel for each task ID of ids on CancelChannel, in
// pipelines of CancelChunk (never one round trip per task). Publishing
// reaches every asynq server of this Redis; the one running the task
// cancels its handler, the others ignore it, and a task no server runs is
// not affected. It returns how many cancels were published before an
// error; the error names the operation and wraps the Redis error (or
// context.DeadlineExceeded when its own timeout fired).
func (c *Canceller) Cancel(ctx context.Context, ids []string) (sent int, err error) {
	for start := 0; start < len(ids); start += CancelChunk {
		chunk := ids[start:min(start+CancelChunk, len(ids))]
		cctx, done := redisop.Timeout(ctx, "asynqstate.Canceller.Cancel", c.opTimeout)
		_, err := c.client.Pipelined(cctx, func(p redis.Pipeliner) error {
			for _, id := range chunk {
				p.Publish(cctx, CancelChannel, id)
			}
			return nil
		})
		if err = done(err); err != nil {
			return sent, fmt.Errorf("publishing %d cancel(s): %w", len(chunk), err)
		}
		sent += len(chunk)
	}
	return sent, nil
}
