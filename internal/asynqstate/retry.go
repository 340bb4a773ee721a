package asynqstate

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/jobreaper/jobreaper/internal/failpoint"
	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/queue"
)

// ErrReplaceRefused means RetryReplacer.Replace changed nothing: asynq does
// not hold the task archived or completed (it waits or runs: it will be
// delivered; or it is gone: there is no payload to send), or its type is
// not the row's. The error says which.
var ErrReplaceRefused = errors.New("task not replaced")

// ErrTaskGone wraps ErrReplaceRefused when asynq holds no task for the
// job: a retry of it is impossible.
var ErrTaskGone = fmt.Errorf("%w: asynq holds no task for the job", ErrReplaceRefused)

// RetryReplacer runs a retry-reaped job again: it replaces the archived or
// completed task asynq holds for it by a new task of the same ID, type and
// payload, as requeue does, delivered after a delay. This is the one path
// on which jobreaper writes asynq's keys: a delete of the task, then an
// enqueue of the same ID. It is safe for concurrent use.
type RetryReplacer struct {
	client *asynq.Client
	insp   *asynq.Inspector
	store  queue.EnqueueStore
}

// NewRetryReplacer returns a RetryReplacer over rdb (the Redis of the
// asynq queues; built with ContextTimeoutEnabled: true) and store (the
// job rows queue.Enqueue reads).
func NewRetryReplacer(rdb redis.UniversalClient, store queue.EnqueueStore) *RetryReplacer {
	return &RetryReplacer{client: asynq.NewClientFromRedisClient(rdb), insp: asynq.NewInspectorFromRedisClient(rdb), store: store}
}

// Replace deletes job jobID's archived or completed task in queue q and
// enqueues a new one with the same ID, type, payload and MaxRetry through
// queue.Enqueue (the row's queue, the type's hard_timeout), delivered in
// processIn. typ is the row's type.
//
// Errors: ErrTaskGone when asynq holds no task (nothing changed);
// ErrReplaceRefused wrapped with the task's state when it waits or runs,
// or its type is not typ (nothing changed), or, after the delete, when
// another replica enqueued the replacement first or the job ended
// meanwhile; a wrapped Redis error naming
// the step otherwise: after the delete, the job's task is gone until the
// enqueue succeeds (a later pass fails the job as reap_retry_impossible).
func (r *RetryReplacer) Replace(ctx context.Context, jobID, q, typ string, processIn time.Duration) error {
	info, err := r.insp.GetTaskInfo(q, jobID)
	switch {
	case errors.Is(err, asynq.ErrQueueNotFound), errors.Is(err, asynq.ErrTaskNotFound):
		return fmt.Errorf("job %s in queue %q: %w", jobID, q, ErrTaskGone)
	case err != nil:
		return fmt.Errorf("asynqstate.RetryReplacer: job %s: looking the task up in queue %q: %w", jobID, q, err)
	}
	if info.State != asynq.TaskStateArchived && info.State != asynq.TaskStateCompleted {
		return fmt.Errorf("job %s in queue %q: %w: asynq holds it %s", jobID, q, ErrReplaceRefused, info.State)
	}
	if info.Type != typ {
		return fmt.Errorf("job %s in queue %q: %w: asynq's task has type %q, the row %q", jobID, q, ErrReplaceRefused, info.Type, typ)
	}
	if err := r.insp.DeleteTask(q, jobID); err != nil && !errors.Is(err, asynq.ErrTaskNotFound) {
		return fmt.Errorf("asynqstate.RetryReplacer: job %s: deleting its %s task: %w", jobID, info.State, err)
	}
	failpoint.Inject("retry-replace-after-delete") // test builds only: the task deleted, none enqueued
	_, err = queue.Enqueue(ctx, r.client, r.store, asynq.NewTask(info.Type, info.Payload), jobID,
		asynq.MaxRetry(info.MaxRetry), asynq.ProcessIn(processIn))
	switch {
	case errors.Is(err, asynq.ErrTaskIDConflict):
		// Another replica replaced it between this delete and enqueue.
		return fmt.Errorf("job %s in queue %q: %w: another replica enqueued its replacement first", jobID, q, ErrReplaceRefused)
	case errors.Is(err, jobs.ErrJobTerminal):
		return fmt.Errorf("job %s in queue %q: %w: the job ended meanwhile: %w", jobID, q, ErrReplaceRefused, err)
	}
	if err != nil {
		return fmt.Errorf("asynqstate.RetryReplacer: job %s: its %s task was deleted but the new one could not be enqueued: %w", jobID, info.State, err)
	}
	return nil
}
