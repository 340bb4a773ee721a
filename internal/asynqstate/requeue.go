package asynqstate

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/jobreaper/jobreaper/internal/pgstore"
	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/queue"
)

// ErrRequeueRefused means Requeue refused a job and changed nothing: the
// job or its task is in a state a requeue must not touch. The error says
// which, and what to do instead.
var ErrRequeueRefused = errors.New("requeue refused")

// RequeueStore is what Requeue needs from PostgreSQL; *jobs.Store
// satisfies it.
type RequeueStore interface {
	queue.EnqueueStore
	// Requeue puts the job back to QUEUED with its generation raised, if
	// it is still as read; pgstore.ErrChangedSinceRead otherwise.
	Requeue(ctx context.Context, p pgstore.RequeueParams) (int64, error)
}

// Requeuer runs a FAILED or stale QUEUED job again: its row goes back to
// QUEUED with the generation raised, and the task asynq still holds for
// it (archived or completed; with WithReplaceWaiting also one that waits
// to be delivered) is replaced by a new task of the same ID, type and
// payload. It is safe for concurrent use.
type Requeuer struct {
	client         *asynq.Client
	insp           *asynq.Inspector
	store          RequeueStore
	replaceWaiting bool
}

// RequeuerOption configures a Requeuer.
type RequeuerOption func(*Requeuer)

// WithReplaceWaiting makes Requeue replace the task of a FAILED job that
// waits in asynq's pending, scheduled or retry set (after a reap whose
// cancel made asynq schedule a retry, for example) instead of refusing
// it: the waiting task is deleted and a new one enqueued, as for an
// archived task. Without it such a job is refused, since its waiting
// delivery is refused by the start guard (the job is FAILED) and asynq
// then archives the task, after which a plain requeue works.
func WithReplaceWaiting(on bool) RequeuerOption {
	return func(r *Requeuer) { r.replaceWaiting = on }
}

// NewRequeuer returns a Requeuer over rdb (the Redis of the asynq queues;
// build it with ContextTimeoutEnabled: true) and store.
func NewRequeuer(rdb redis.UniversalClient, store RequeueStore, opts ...RequeuerOption) *Requeuer {
	r := &Requeuer{client: asynq.NewClientFromRedisClient(rdb), insp: asynq.NewInspectorFromRedisClient(rdb), store: store}
	for _, o := range opts {
		o(r)
	}
	return r
}

// Requeued is what Requeue did for one job, or found when it refused it.
type Requeued struct {
	JobID string
	Queue string
	// FromStatus is the row's status before: FAILED or QUEUED (on a
	// refusal, whatever it was; "" when there is no row).
	FromStatus string
	// TaskState is the state of the task asynq held: archived or completed
	// (pending, scheduled or retry when WithReplaceWaiting replaced it). On
	// a refusal it is what the lookup found, "not_found" when asynq holds
	// no task, "" when the task was not or could not be looked up.
	TaskState string
	// Generation is the row's new generation; on a refusal, its generation
	// as read (0 when there is no row).
	Generation int64
	// ReplacedWaiting is true when the task replaced was waiting to be
	// delivered (WithReplaceWaiting), not archived or completed.
	ReplacedWaiting bool
}

// Requeue runs job jobID again, recording reason in a "requeued" event.
//
// In order: it reads the row and refuses (ErrRequeueRefused, nothing
// changed) an unknown ID; it looks the task up in asynq; it refuses a
// PROCESSING job (the reaper or its worker owns it) and a COMPLETED one;
// it refuses when asynq holds the task active or aggregating, or pending,
// scheduled or in retry (for a QUEUED job that delivery will run it; for a
// FAILED job the start guard refuses that delivery and asynq then
// archives the task, so the refusal says to wait for it or to replace the
// waiting task, WithReplaceWaiting, which Requeue then does), when asynq
// holds no task at all (no payload to send: the product must enqueue the
// job itself), and when the task's type is not the row's. Then: the row
// goes back to QUEUED with its generation raised (pgstore.Store.Requeue, a
// compare-and-set on what was read, so a job that moved meanwhile is
// refused too, and the type's on_requeued cascade runs in its
// transaction), the old task is deleted, and a new one is enqueued with
// the same ID, type and payload through queue.Enqueue: the row's queue, Timeout
// = the type's hard_timeout, the old task's MaxRetry, and no deadline,
// whatever the old task had.
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
		return out, fmt.Errorf("asynqstate.Requeuer: job %s: reading the row: %w", jobID, err)
	}
	out.FromStatus, out.Queue, out.Generation = row.Status, row.Queue, row.Generation
	if out.Queue == "" {
		out.Queue = queue.QueueDefault
	}
	// Looked up before the row's status is judged, so that every refusal
	// says where asynq holds the task; a lookup that fails is an error only
	// where the answer decides.
	info, lookupErr := r.insp.GetTaskInfo(out.Queue, jobID)
	noTask := errors.Is(lookupErr, asynq.ErrQueueNotFound) || errors.Is(lookupErr, asynq.ErrTaskNotFound)
	switch {
	case noTask:
		out.TaskState, lookupErr = string(TaskNotFound), nil
	case lookupErr == nil:
		out.TaskState = info.State.String()
	}
	switch row.Status {
	case jobs.StatusProcessing:
		return refuse("it is PROCESSING (a worker or the reaper owns it)")
	case jobs.StatusCompleted:
		return refuse("it is COMPLETED")
	}
	if lookupErr != nil {
		return out, fmt.Errorf("asynqstate.Requeuer: job %s: looking the task up in queue %q: %w", jobID, out.Queue, lookupErr)
	}
	if noTask {
		return refuse("asynq holds no task for it in queue %q, so there is no payload to send: the product must enqueue the job again", out.Queue)
	}
	switch info.State {
	case asynq.TaskStateArchived, asynq.TaskStateCompleted:
	case asynq.TaskStatePending, asynq.TaskStateScheduled, asynq.TaskStateRetry:
		if row.Status != jobs.StatusFailed {
			return refuse("asynq holds its task %s in queue %q, so it will run (already requeued?)", out.TaskState, out.Queue)
		}
		if !r.replaceWaiting {
			return refuse("asynq holds its task %s in queue %q, to be delivered %s: the start guard refuses that delivery (the job is FAILED) "+
				"and asynq then archives the task, so run requeue again after that, or requeue with --replace-waiting to delete the waiting task now",
				out.TaskState, out.Queue, deliveryTime(info))
		}
		out.ReplacedWaiting = true
	default:
		return refuse("asynq holds its task %s in queue %q, so it may still run", out.TaskState, out.Queue)
	}
	if info.Type != row.Type {
		return refuse("asynq's task has type %q, the row has type %q", info.Type, row.Type)
	}
	detail := map[string]any{"queue": out.Queue, "task_state": out.TaskState, "task_type": info.Type}
	if out.ReplacedWaiting {
		detail["replaced_waiting"] = true
	}
	gen, err := r.store.Requeue(ctx, pgstore.RequeueParams{
		JobID: jobID, Status: row.Status, Generation: row.Generation, Reason: reason, Detail: detail,
	})
	if errors.Is(err, pgstore.ErrChangedSinceRead) {
		return refuse("the job changed while it was being requeued; run the command again")
	}
	if err != nil {
		return out, fmt.Errorf("asynqstate.Requeuer: job %s: %w", jobID, err)
	}
	out.Generation = gen
	if err := r.insp.DeleteTask(out.Queue, jobID); err != nil && !errors.Is(err, asynq.ErrTaskNotFound) {
		// A waiting task delivered meanwhile is active: asynq refuses to
		// delete it, and the start guard claims it for the new generation.
		return out, fmt.Errorf("asynqstate.Requeuer: job %s is QUEUED at generation %d but its %s task could not be deleted "+
			"(if asynq delivered it meanwhile, that delivery runs the job; otherwise run requeue again): %w",
			jobID, gen, out.TaskState, err)
	}
	if _, err := queue.Enqueue(ctx, r.client, r.store, asynq.NewTask(info.Type, info.Payload), jobID, asynq.MaxRetry(info.MaxRetry)); err != nil {
		return out, fmt.Errorf("asynqstate.Requeuer: job %s is QUEUED at generation %d and its %s task was deleted, but the new task could not be enqueued "+
			"(the product must enqueue it, type %q, %d payload bytes): %w", jobID, gen, out.TaskState, info.Type, len(info.Payload), err)
	}
	return out, nil
}

// deliveryTime says when asynq delivers a waiting task: "now" for a
// pending one, else its next process time (as asynq recorded it), in UTC.
func deliveryTime(info *asynq.TaskInfo) string {
	if info.State == asynq.TaskStatePending || info.NextProcessAt.IsZero() {
		return "now"
	}
	return "at " + info.NextProcessAt.UTC().Format(time.RFC3339)
}
