package queue

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/hibiken/asynq"

	"github.com/jobreaper/jobreaper/jobs"
)

// QueueDefault is the asynq queue of a job whose queue column is NULL;
// it is asynq's own default queue.
const QueueDefault = "default"

// EnqueueOpTimeoutDefault bounds Enqueue's call to Redis.
const EnqueueOpTimeoutDefault = 5 * time.Second

// ErrOptionConflict means a caller's asynq option contradicts the job row:
// a TaskID other than the job ID, or a Queue other than the row's queue.
// The reaper and the start guard find a job's task by that ID and queue.
var ErrOptionConflict = errors.New("asynq option conflicts with the job row")

// ErrTypeConflict means the task's type (asynq.Task.Type, which selects
// the handler) is not the job row's type. The reaper judges the job by the
// row's type limits and the cascades run by the row's type, while asynq
// would run the other type's handler: the two would disagree about what
// the job is.
var ErrTypeConflict = errors.New("task type differs from the job row's type")

// EnqueueStore is what Enqueue needs from PostgreSQL; *jobs.Store
// satisfies it.
type EnqueueStore interface {
	// Get reads the job row and its type limits; an error wrapping
	// jobs.ErrNotFound when none.
	Get(ctx context.Context, id string) (jobs.Snapshot, error)
}

// Enqueue enqueues task as the task of job jobID.
//
// Order: commit the job row first, then call Enqueue. A task must never
// exist without its row: the start guard would find no row to claim, and
// the reaper would have nothing to judge the task by. (A row without a
// task, when Enqueue fails after the commit, is visible and can be
// re-enqueued.)
//
// Enqueue reads the row and passes, before the caller's opts:
// asynq.TaskID(jobID); asynq.Queue(the row's queue, QueueDefault when
// NULL); asynq.Timeout(the type's hard_timeout, jobs.HardTimeoutDefault
// (24 h) when NULL or when the type is unknown). asynq applies options in
// order, so a caller's Timeout, Deadline, MaxRetry and the like override
// ours (a shorter Timeout makes asynq retry the task before the reaper's
// softer rule can act, see bad_limits). A caller's TaskID or Queue must
// equal ours: anything else is refused with ErrOptionConflict, since the
// task ID is the job ID and the queue is where the reaper looks.
//
// Enqueue also refuses, before anything reaches Redis, what the row or the
// start guard contradicts: a task whose type is not the row's type
// (ErrTypeConflict, naming both types), and asynq.Group (ErrOptionConflict):
// asynq replaces a group's member tasks by one aggregated task whose ID is
// no job's, which the start guard can never claim.
//
// Errors: an error wrapping jobs.ErrInvalidArgument for a nil task; an
// error wrapping jobs.ErrNotFound when the row is missing (the
// row was not committed first); ErrTypeConflict; jobs.ErrJobTerminal when the job is
// already COMPLETED or FAILED (requeue it first); ErrOptionConflict; asynq.ErrTaskIDConflict
// wrapped when a task with this ID already exists in the queue (asynq keeps
// completed and archived tasks too); "queue.Enqueue timed out after 5s"
// wrapping context.DeadlineExceeded; any other store or Redis error,
// wrapped with the job ID.
func Enqueue(ctx context.Context, client *asynq.Client, store EnqueueStore, task *asynq.Task, jobID string, opts ...asynq.Option) (*asynq.TaskInfo, error) {
	if task == nil {
		return nil, fmt.Errorf("queue.Enqueue: job %s: task is nil: %w", jobID, jobs.ErrInvalidArgument)
	}
	row, err := store.Get(ctx, jobID)
	if err != nil {
		return nil, fmt.Errorf("queue.Enqueue: job %s: reading the job row: %w", jobID, err)
	}
	if task.Type() != row.Type {
		return nil, fmt.Errorf("queue.Enqueue: job %s: task type %q is not the row's type %q: %w",
			jobID, task.Type(), row.Type, ErrTypeConflict)
	}
	if row.Status == jobs.StatusCompleted || row.Status == jobs.StatusFailed {
		// The guard would refuse the task anyway; enqueueing it would only
		// leave an archived task behind.
		return nil, fmt.Errorf("queue.Enqueue: job %s is %s: %w", jobID, row.Status, jobs.ErrJobTerminal)
	}
	queue := row.Queue
	if queue == "" {
		queue = QueueDefault
	}
	timeout := jobs.HardTimeoutDefault
	if row.Limits != nil && row.Limits.HardTimeout != nil {
		timeout = *row.Limits.HardTimeout
	}
	for _, o := range opts {
		switch o.Type() {
		case asynq.TaskIDOpt:
			if v, _ := o.Value().(string); v != jobID {
				return nil, fmt.Errorf("queue.Enqueue: job %s: option %s: %w: the task ID must be the job ID", jobID, o, ErrOptionConflict)
			}
		case asynq.QueueOpt:
			if v, _ := o.Value().(string); v != queue {
				return nil, fmt.Errorf("queue.Enqueue: job %s: option %s: %w: the job's queue is %q", jobID, o, ErrOptionConflict, queue)
			}
		case asynq.GroupOpt:
			return nil, fmt.Errorf("queue.Enqueue: job %s: option %s: %w: asynq replaces a group's tasks by one whose ID is no job's, which the start guard cannot claim",
				jobID, o, ErrOptionConflict)
		}
	}
	all := append([]asynq.Option{asynq.TaskID(jobID), asynq.Queue(queue), asynq.Timeout(timeout)}, opts...)
	cctx, done := opTimeout(ctx, "queue.Enqueue", EnqueueOpTimeoutDefault)
	info, err := client.EnqueueContext(cctx, task, all...)
	if err != nil {
		return nil, done(fmt.Errorf("job %s in queue %q: %w", jobID, queue, err))
	}
	return info, done(nil)
}
