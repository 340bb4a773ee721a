package asynqstate

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/hibiken/asynq"
)

// Registry is what asynq's live-server registry held at one read: the
// queues active servers serve, and the processes that run a live server.
//
// asynq v0.26.0 keeps the registry as the sorted set asynq:servers, whose
// members are the keys asynq:servers:{<host>:<pid>:<server id>} scored by
// their expiry (Unix seconds), each key holding the server's info with a
// TTL of two heartbeats (asynq's heartbeater writes both every 5 s, so a
// killed process leaves within 10 s; a clean shutdown removes them at
// once). The Inspector reads the members not yet expired and their info.
type Registry struct {
	// Queues are the queues of servers whose status is active.
	Queues map[string]bool
	// Processes are "<host>:<pid>" of every live server, whatever its
	// status (a stopped server's process still runs): the name the start
	// guard gives a worker by default.
	Processes map[string]bool
}

// LiveServers reads asynq's live-server registry once. It returns a
// wrapped Redis error naming the operation.
func (s *StatusReader) LiveServers(ctx context.Context) (Registry, error) {
	if err := ctx.Err(); err != nil {
		return Registry{}, fmt.Errorf("asynqstate.StatusReader.LiveServers: %w", err)
	}
	servers, err := s.inspector.Servers()
	if err != nil {
		return Registry{}, fmt.Errorf("asynqstate.StatusReader.LiveServers: %w", err)
	}
	reg := Registry{Queues: map[string]bool{}, Processes: map[string]bool{}}
	for _, srv := range servers {
		reg.Processes[srv.Host+":"+strconv.Itoa(srv.PID)] = true
		if srv.Status != "active" {
			continue
		}
		for q := range srv.Queues {
			reg.Queues[q] = true
		}
	}
	return reg, nil
}

// ErrLeaseExpiredText is the last error asynq records on a task whose
// lease expired (its worker stopped extending it: killed, or cut off from
// Redis) when its recoverer archives or retries it.
var ErrLeaseExpiredText = asynq.ErrLeaseExpired.Error()

// TaskEnd is where asynq holds a task and the last error it recorded.
type TaskEnd struct {
	Status TaskStatus
	// LastErr is the task's last error ("" for none, or when the task or
	// its queue is not found).
	LastErr string
}

// TaskEnds looks each task of refs up with its last error, in order, one
// Inspector lookup per task: meant for the few jobs of a type that opted
// into dead-early reaps, not for every active task. It returns a wrapped
// Redis error naming the operation.
func (s *StatusReader) TaskEnds(ctx context.Context, refs []TaskRef) ([]TaskEnd, error) {
	out := make([]TaskEnd, len(refs))
	for i, ref := range refs {
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("asynqstate.StatusReader.TaskEnds: %w", err)
		}
		info, err := s.inspector.GetTaskInfo(ref.Queue, ref.ID)
		switch {
		case errors.Is(err, asynq.ErrQueueNotFound):
			out[i].Status = TaskQueueNotFound
		case errors.Is(err, asynq.ErrTaskNotFound):
			out[i].Status = TaskNotFound
		case err != nil:
			return nil, fmt.Errorf("asynqstate.StatusReader.TaskEnds: task %s of queue %s: %w", ref.ID, ref.Queue, err)
		default:
			st, ok := asynqStates[info.State.String()]
			if !ok {
				return nil, fmt.Errorf("asynqstate.StatusReader.TaskEnds: task %s of queue %s: unknown state %q", ref.ID, ref.Queue, info.State)
			}
			out[i] = TaskEnd{Status: st, LastErr: info.LastErr}
		}
	}
	return out, nil
}
