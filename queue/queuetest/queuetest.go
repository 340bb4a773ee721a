// Package queuetest puts many tasks into asynq's active state quickly, for
// tests and benchmarks that need thousands of active tasks without running
// thousands of handlers.
package queuetest

import (
	"context"
	"fmt"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
)

// enqueueWorkers is how many enqueues run at once: asynq's Client makes one
// round trip per task.
const enqueueWorkers = 16

// dequeueScript moves up to ARGV[1] tasks from the pending list to the
// active list the way asynq v0.26.0's dequeue does for each task a server
// starts: RPOPLPUSH, state "active", no pending_since, and a lease entry
// (here expiring at ARGV[2], far ahead, so no recoverer or Inspector treats
// them as orphans). KEYS[1] pending, KEYS[2] active, KEYS[3] lease;
// ARGV[3] task key prefix. Returns how many tasks moved.
var dequeueScript = redis.NewScript(`
local n = 0
for i = 1, tonumber(ARGV[1]) do
  local id = redis.call("RPOPLPUSH", KEYS[1], KEYS[2])
  if not id then break end
  local key = ARGV[3] .. id
  redis.call("HSET", key, "state", "active")
  redis.call("HDEL", key, "pending_since")
  redis.call("ZADD", KEYS[3], ARGV[2], id)
  n = n + 1
end
return n
`)

// MakeActive enqueues one task of type typ per ID into queue with asynq's
// own Client (so each task hash is asynq's), then moves them all to the
// active list as asynq's dequeue would, without a server: no handler runs
// and nothing moves them back. No server may serve queue meanwhile.
func MakeActive(ctx context.Context, rdb redis.UniversalClient, queue, typ string, ids []string) error {
	client := asynq.NewClientFromRedisClient(rdb)
	errs := make(chan error, enqueueWorkers)
	next := make(chan string)
	for range enqueueWorkers {
		go func() {
			var first error
			for id := range next {
				if first != nil {
					continue
				}
				if _, err := client.EnqueueContext(ctx, asynq.NewTask(typ, nil), asynq.TaskID(id), asynq.Queue(queue),
					asynq.MaxRetry(0)); err != nil {
					first = fmt.Errorf("enqueueing %q: %w", id, err)
				}
			}
			errs <- first
		}()
	}
	for _, id := range ids {
		next <- id
	}
	close(next)
	var first error
	for range enqueueWorkers {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
	}
	if first != nil {
		return first
	}
	prefix := "asynq:{" + queue + "}:"
	lease := time.Now().Add(24 * time.Hour).Unix()
	moved := 0
	for moved < len(ids) {
		n, err := dequeueScript.Run(ctx, rdb, []string{prefix + "pending", prefix + "active", prefix + "lease"},
			1000, lease, prefix+"t:").Int()
		if err != nil {
			return fmt.Errorf("activating tasks of %s: %w", queue, err)
		}
		if n == 0 {
			return fmt.Errorf("activating tasks of %s: %d of %d moved, the pending list is empty", queue, moved, len(ids))
		}
		moved += n
	}
	return nil
}

// Remove deletes every key of queue and its entry in asynq:queues. asynq's
// Inspector refuses to delete a queue with active tasks, which MakeActive
// leaves behind.
func Remove(ctx context.Context, rdb redis.UniversalClient, queue string) error {
	iter := rdb.Scan(ctx, 0, "asynq:{"+queue+"}:*", 1000).Iterator()
	var keys []string
	for iter.Next(ctx) {
		keys = append(keys, iter.Val())
		if len(keys) == 1000 {
			if err := rdb.Del(ctx, keys...).Err(); err != nil {
				return err
			}
			keys = keys[:0]
		}
	}
	if err := iter.Err(); err != nil {
		return err
	}
	if len(keys) > 0 {
		if err := rdb.Del(ctx, keys...).Err(); err != nil {
			return err
		}
	}
	return rdb.SRem(ctx, "asynq:queues", queue).Err()
}
