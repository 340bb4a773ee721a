package queue

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/jobreaper/jobreaper/internal/redisop"
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
	// Get reads the job row and its type limits (Snapshot.Limits nil when
	// no job_types row names the type); an error wrapping jobs.ErrNotFound
	// when there is no row.
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
// (24 h) when NULL). asynq applies options in
// order, so a caller's Timeout, Deadline, MaxRetry and the like override
// ours (a shorter Timeout makes asynq retry the task before the reaper's
// softer rule can act, see bad_limits). A caller's TaskID or Queue must
// equal ours: anything else is refused with ErrOptionConflict, since the
// task ID is the job ID and the queue is where the reaper looks.
//
// Enqueue also refuses, before anything reaches Redis, what the row or the
// start guard contradicts: a task whose type is not the row's type
// (ErrTypeConflict, naming both types); a row whose type has no job_types
// row (jobs.ErrUnknownType, naming the type), which the reaper would skip
// as unknown_type on every pass and whose hard timeout nobody set. The
// type is checked in the same read as the row (Get joins job_types), so a
// type registered just before the call is known; and asynq.Group (ErrOptionConflict):
// asynq replaces a group's member tasks by one aggregated task whose ID is
// no job's, which the start guard can never claim.
//
// Enqueue cannot remove a task an earlier life of the job ID left in
// asynq (it has no Inspector): Enqueuer.Enqueue does that.
//
// Errors: an error wrapping jobs.ErrInvalidArgument for a nil task; an
// error wrapping jobs.ErrNotFound when the row is missing (the row was not
// committed first); ErrTypeConflict; jobs.ErrUnknownType; jobs.ErrJobTerminal when the job is
// already COMPLETED or FAILED (requeue it first); ErrOptionConflict;
// asynq.ErrTaskIDConflict wrapped when a task with this ID already exists
// in the queue (asynq keeps completed and archived tasks too); "queue.Enqueue
// timed out after 5s" wrapping context.DeadlineExceeded; any other store or
// Redis error, wrapped with the job ID.
func Enqueue(ctx context.Context, client *asynq.Client, store EnqueueStore, task *asynq.Task, jobID string, opts ...asynq.Option) (*asynq.TaskInfo, error) {
	return enqueue(ctx, client, nil, store, task, jobID, opts)
}

// enqueue is Enqueue, and with insp Enqueuer.Enqueue.
func enqueue(ctx context.Context, client *asynq.Client, insp *asynq.Inspector, store EnqueueStore, task *asynq.Task, jobID string, opts []asynq.Option) (*asynq.TaskInfo, error) {
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
	if row.Limits == nil {
		// The row was read joined with its job_types row, so this answer
		// is as fresh as the read: a type registered a moment ago is
		// known, without a cache that could miss it.
		return nil, fmt.Errorf("queue.Enqueue: job %s: type %q has no job_types row%s; nothing was enqueued and the job row you committed stays %s without a task: "+
			"register the type, then call Enqueue again for this job (or delete the row): %w",
			jobID, row.Type, registerHint(store, row.Type), row.Status, jobs.ErrUnknownType)
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
	cctx, done := redisop.Timeout(ctx, "queue.Enqueue", EnqueueOpTimeoutDefault)
	info, err := client.EnqueueContext(cctx, task, all...)
	if errors.Is(err, asynq.ErrTaskIDConflict) && newLife(row) {
		if insp == nil {
			return nil, done(fmt.Errorf("job %s in queue %q: %w (the row starts a new life of the ID and asynq may still hold an earlier life's task: queue.Enqueuer removes a completed or archived one)", jobID, queue, err))
		}
		var state asynq.TaskState
		if state, err = removeEarlierLife(insp, queue, jobID); err != nil {
			return nil, done(fmt.Errorf("job %s in queue %q: %w", jobID, queue, err))
		}
		if info, err = client.EnqueueContext(cctx, task, all...); err == nil {
			return info, done(nil)
		}
		err = fmt.Errorf("after removing the %s task of an earlier life: %w", state, err)
	}
	if err != nil {
		return nil, done(fmt.Errorf("job %s in queue %q: %w", jobID, queue, err))
	}
	return info, done(nil)
}

// newLife reports whether row is QUEUED and not claimed since it was
// inserted (or since an UPDATE started a new life): no attempt of this
// life ran, so no task asynq holds under the ID can be one this life
// needs, unless it still waits to run.
func newLife(row jobs.Snapshot) bool {
	return row.Status == jobs.StatusQueued && row.Generation == row.FirstGeneration
}

// removeEarlierLife deletes jobID's task from queue when asynq will never
// run it again (completed or archived), and returns the state it had. A
// task that is pending, scheduled, waiting to retry or active may still be
// this life's, so it is left alone and the conflict stands. The state is
// read and the task deleted in two steps: between them only an operator
// (Inspector.RunTask of the archived task) can move it, and Enqueue then
// replaces that run by the new task of the same job.
func removeEarlierLife(insp *asynq.Inspector, queue, jobID string) (asynq.TaskState, error) {
	info, err := insp.GetTaskInfo(queue, jobID)
	if err != nil {
		return 0, fmt.Errorf("%w, and reading that task failed: %w", asynq.ErrTaskIDConflict, err)
	}
	if info.State != asynq.TaskStateCompleted && info.State != asynq.TaskStateArchived {
		return info.State, fmt.Errorf("%w: asynq holds the job's task %s, which may still run, so it is not removed", asynq.ErrTaskIDConflict, info.State)
	}
	if err := insp.DeleteTask(queue, jobID); err != nil && !errors.Is(err, asynq.ErrTaskNotFound) {
		return info.State, fmt.Errorf("%w, and removing the earlier life's %s task failed: %w", asynq.ErrTaskIDConflict, info.State, err)
	}
	return info.State, nil
}

// Enqueuer enqueues the tasks of job rows like Enqueue and, for a job ID
// the product reused, first removes the task an earlier life of the ID
// left in asynq: asynq keeps completed tasks for their retention and
// archived ones for 90 days, and refuses a second task with the same ID
// meanwhile. It is safe for concurrent use.
type Enqueuer struct {
	client *asynq.Client
	insp   *asynq.Inspector
	store  EnqueueStore
}

// NewEnqueuer returns an Enqueuer over rdb (build it with
// ContextTimeoutEnabled: true, as for NewMarkerStore) that reads job rows
// through store.
func NewEnqueuer(rdb redis.UniversalClient, store EnqueueStore) *Enqueuer {
	return &Enqueuer{
		client: asynq.NewClientFromRedisClient(rdb),
		insp:   asynq.NewInspectorFromRedisClient(rdb),
		store:  store,
	}
}

// Enqueue enqueues task as the task of job jobID, as the package's Enqueue
// does (same options, checks and errors), with one difference: when asynq
// already holds a task with the ID and the row starts a new life (QUEUED,
// and its generation is still the life's first: no claim since the row was
// inserted), a completed or archived task is an earlier life's, or one
// this life never got to run: it is removed, and the task enqueued. A row
// of this life was never claimed then, so the removed task carried no
// attempt of it. A pending, scheduled, retry or active task is never
// removed (it may still run this life's attempt), nor is any task of a row
// claimed in its life (requeue such a job as docs/operating.md, "Requeuing
// a job", describes): the error
// wraps asynq.ErrTaskIDConflict and names the task's state.
func (e *Enqueuer) Enqueue(ctx context.Context, task *asynq.Task, jobID string, opts ...asynq.Option) (*asynq.TaskInfo, error) {
	return enqueue(ctx, e.client, e.insp, e.store, task, jobID, opts)
}

// registerHint is the statement that registers typ, for the error of an
// unregistered type: in the store's schema when the store names it
// (*jobs.Store does), so that a product whose own tables live in public
// is not sent to the wrong job_types.
func registerHint(store EnqueueStore, typ string) string {
	literal := "'" + strings.ReplaceAll(typ, "'", "''") + "'"
	s, ok := store.(interface{ Schema() string })
	if !ok {
		return " (register it: INSERT INTO job_types (name, max_runtime) VALUES (" + literal + ", ...))"
	}
	return fmt.Sprintf(` in schema %q (register it: INSERT INTO "%s".job_types (name, max_runtime) VALUES (%s, ...))`,
		s.Schema(), strings.ReplaceAll(s.Schema(), `"`, `""`), literal)
}
