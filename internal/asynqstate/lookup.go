package asynqstate

import (
	"context"
	"errors"
	"fmt"

	"github.com/hibiken/asynq"
)

// TaskStatus is where asynq holds a task, as far as the reaper's lost-task
// check needs to know it.
type TaskStatus string

// Task statuses. TaskNotFound covers a task asynq no longer holds at all
// (deleted, expired from the completed set, or its queue is gone).
const (
	TaskActive      TaskStatus = "active"
	TaskPending     TaskStatus = "pending"
	TaskScheduled   TaskStatus = "scheduled"
	TaskRetry       TaskStatus = "retry"
	TaskAggregating TaskStatus = "aggregating"
	TaskArchived    TaskStatus = "archived"
	TaskCompleted   TaskStatus = "completed"
	TaskNotFound    TaskStatus = "not_found"
	// TaskQueueNotFound: asynq does not know the task's queue at all (a
	// name only the row uses, another Redis database, data lost). Nothing
	// can be said about the task, so the reaper does not call it lost.
	TaskQueueNotFound TaskStatus = "queue_not_found"
)

// WillRun reports whether asynq may still run the task: it is active, or
// waits in pending, scheduled, retry or aggregating. Archived, completed and
// not-found tasks are never run again by asynq (v0.26.0). For
// TaskQueueNotFound it answers true: without the queue there is no
// evidence either way, and a job is never failed on a guess.
func (s TaskStatus) WillRun() bool {
	switch s {
	case TaskActive, TaskPending, TaskScheduled, TaskRetry, TaskAggregating, TaskQueueNotFound:
		return true
	}
	return false
}

// TaskLookup finds one task; InspectorLister satisfies it.
type TaskLookup interface {
	// TaskStatus returns where asynq holds task id of queue.
	TaskStatus(ctx context.Context, queue, id string) (TaskStatus, error)
}

var taskStatuses = map[asynq.TaskState]TaskStatus{
	asynq.TaskStateActive:      TaskActive,
	asynq.TaskStatePending:     TaskPending,
	asynq.TaskStateScheduled:   TaskScheduled,
	asynq.TaskStateRetry:       TaskRetry,
	asynq.TaskStateAggregating: TaskAggregating,
	asynq.TaskStateArchived:    TaskArchived,
	asynq.TaskStateCompleted:   TaskCompleted,
}

// TaskStatus looks task id of queue up with the Inspector. A task asynq
// does not hold is TaskNotFound, a queue it does not know
// TaskQueueNotFound, both with a nil error.
//
// Errors: ctx's error when ctx is already done; any other Inspector error,
// wrapped and naming the queue and task; an error for a state this package
// does not know (a newer asynq), so that nothing is reaped on a guess.
func (l *InspectorLister) TaskStatus(ctx context.Context, queue, id string) (TaskStatus, error) {
	if err := ctx.Err(); err != nil {
		return "", fmt.Errorf("asynqstate.InspectorLister.TaskStatus: queue %q task %q: %w", queue, id, err)
	}
	info, err := l.inspector.GetTaskInfo(queue, id)
	if errors.Is(err, asynq.ErrQueueNotFound) {
		return TaskQueueNotFound, nil
	}
	if errors.Is(err, asynq.ErrTaskNotFound) {
		return TaskNotFound, nil
	}
	if err != nil {
		return "", fmt.Errorf("asynqstate.InspectorLister.TaskStatus: queue %q task %q: %w", queue, id, err)
	}
	st, ok := taskStatuses[info.State]
	if !ok {
		return "", fmt.Errorf("asynqstate.InspectorLister.TaskStatus: queue %q task %q: unknown asynq task state %v", queue, id, info.State)
	}
	return st, nil
}
