package queue

import (
	"context"
	"errors"
	"fmt"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/jobreaper/jobreaper/jobs"
)

// ErrRequeueRefused means Requeue refused a job and changed nothing: the
// job or its task is in a state a requeue must not touch. The error says
// which, and what to do instead.
var ErrRequeueRefused = errors.New("requeue refused")

// RequeueStore is what Requeue needs from PostgreSQL; *jobs.Store
// satisfies it.
type RequeueStore interface {
	EnqueueStore
	// Requeue puts the job back to QUEUED with its generation raised, if
	// it is still as read; jobs.ErrChangedSinceRead otherwise.
	Requeue(ctx context.Context, p jobs.RequeueParams) (int64, error)
}

// Requeuer runs a FAILED or stale QUEUED job again: its row goes back to
// QUEUED with the generation raised, and the task asynq still holds for
// it (archived or completed) is replaced by a new task of the same ID,
// type and payload. It is safe for concurrent use.
type Requeuer struct {
	client *asynq.Client
	insp   *asynq.Inspector
	store  RequeueStore
}

// NewRequeuer returns a Requeuer over rdb (the Redis of the asynq queues;
// build it with ContextTimeoutEnabled: true) and store.
func NewRequeuer(rdb redis.UniversalClient, store RequeueStore) *Requeuer {
	return &Requeuer{client: asynq.NewClientFromRedisClient(rdb), insp: asynq.NewInspectorFromRedisClient(rdb), store: store}
}

// Requeued is what Requeue did for one job.
type Requeued struct {
	JobID string
	Queue string
	// FromStatus is the row's status before: FAILED or QUEUED.
	FromStatus string
	// TaskState is the state of the task asynq held: archived or completed.
	TaskState string
	// Generation is the row's new generation.
	Generation int64
}

// Requeue runs job jobID again, recording reason in a "requeued" event.
//
// In order: it reads the row and refuses (ErrRequeueRefused, nothing
// changed) an unknown ID, a PROCESSING job (the reaper or its worker owns
// it) and a COMPLETED one; it looks the task up in asynq and refuses when
// asynq holds it active, pending, scheduled, in retry or aggregating (it
// will run: requeueing would run it twice), when asynq holds no task at
// all (no payload to send: the product must enqueue the job itself), and
// when the task's type is not the row's. Then, for an archived or
// completed task: the row goes back to QUEUED with its generation raised
// (jobs.Store.Requeue, a compare-and-set on what was read, so a job that
// moved meanwhile is refused too), the old task is deleted, and a new one
// is enqueued with the same ID, type and payload through Enqueue: the
// row's queue, Timeout = the type's hard_timeout, the old task's
// MaxRetry, and no deadline, whatever the old task had.
//
// Errors: ErrRequeueRefused wrapped with the reason; a wrapped store or
// Redis error, naming what had been done: an error after the row was
// requeued says so (the job is QUEUED, and running Requeue again retries
// the enqueue while asynq still holds the old task).
func (r *Requeuer) Requeue(ctx context.Context, jobID, reason string) (Requeued, error) {
	out := Requeued{JobID: jobID}
	refuse := func(format string, args ...any) (Requeued, error) {
		return out, fmt.Errorf("job %s: %w: %s", jobID, ErrRequeueRefused, fmt.Sprintf(format, args...))
	}
	row, err := r.store.Get(ctx, jobID)
	if errors.Is(err, jobs.ErrNotFound) {
		return refuse("no job has this ID")
	}
	if err != nil {
		return out, fmt.Errorf("queue.Requeuer: job %s: reading the row: %w", jobID, err)
	}
	out.FromStatus, out.Queue = row.Status, row.Queue
	if out.Queue == "" {
		out.Queue = QueueDefault
	}
	switch row.Status {
	case jobs.StatusProcessing:
		return refuse("it is PROCESSING (a worker or the reaper owns it)")
	case jobs.StatusCompleted:
		return refuse("it is COMPLETED")
	}
	info, err := r.insp.GetTaskInfo(out.Queue, jobID)
	if errors.Is(err, asynq.ErrQueueNotFound) || errors.Is(err, asynq.ErrTaskNotFound) {
		return refuse("asynq holds no task for it in queue %q, so there is no payload to send: the product must enqueue the job again", out.Queue)
	}
	if err != nil {
		return out, fmt.Errorf("queue.Requeuer: job %s: looking the task up in queue %q: %w", jobID, out.Queue, err)
	}
	out.TaskState = info.State.String()
	if info.State != asynq.TaskStateArchived && info.State != asynq.TaskStateCompleted {
		return refuse("asynq holds its task %s in queue %q, so it may still run (already requeued?)", out.TaskState, out.Queue)
	}
	if info.Type != row.Type {
		return refuse("asynq's task has type %q, the row has type %q", info.Type, row.Type)
	}
	gen, err := r.store.Requeue(ctx, jobs.RequeueParams{
		JobID: jobID, Status: row.Status, Generation: row.Generation, Reason: reason,
		Detail: map[string]any{"queue": out.Queue, "task_state": out.TaskState, "task_type": info.Type},
	})
	if errors.Is(err, jobs.ErrChangedSinceRead) {
		return refuse("the job changed while it was being requeued; run the command again")
	}
	if err != nil {
		return out, fmt.Errorf("queue.Requeuer: job %s: %w", jobID, err)
	}
	out.Generation = gen
	if err := r.insp.DeleteTask(out.Queue, jobID); err != nil && !errors.Is(err, asynq.ErrTaskNotFound) {
		return out, fmt.Errorf("queue.Requeuer: job %s is QUEUED at generation %d but its %s task could not be deleted (run requeue again): %w",
			jobID, gen, out.TaskState, err)
	}
	if _, err := Enqueue(ctx, r.client, r.store, asynq.NewTask(info.Type, info.Payload), jobID, asynq.MaxRetry(info.MaxRetry)); err != nil {
		return out, fmt.Errorf("queue.Requeuer: job %s is QUEUED at generation %d and its %s task was deleted, but the new task could not be enqueued "+
			"(the product must enqueue it, type %q, %d payload bytes): %w", jobID, gen, out.TaskState, info.Type, len(info.Payload), err)
	}
	return out, nil
}
