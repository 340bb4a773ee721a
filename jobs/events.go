package jobs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/jobreaper/jobreaper/internal/pgcore"
)

// Kinds of job_events rows. The claim writes "claimed" and the reap writes
// "reaped"; the others are below.
const (
	// EventLateResultRejected records a fenced write that changed nothing
	// because the attempt was superseded (stale_worker) or the job had
	// already ended (job_terminal). Its detail is a LateResultDetail. It
	// says which attempt (fencing token) tried to write what, so that side
	// effects the refusal could not undo can be found and cleaned up.
	EventLateResultRejected = "late_result_rejected"
	// EventCompleted is written in the transaction of Complete or
	// AutoComplete, together with the on_completed cascade.
	EventCompleted = "completed"
	// EventFailed is written in the transaction of Fail, together with the
	// on_failed cascade; its detail holds the failure code.
	EventFailed = "failed"
	// EventReleased is written by Release when an attempt hands its job
	// back to the queue for asynq's retry.
	EventReleased = "released"
	// EventCancelled is written by an operator's `jobreaper cancel`, in the
	// transaction that failed the job (ReasonCancelled); its detail holds
	// the operator's reason, the status the job was cancelled from and
	// who ran the command.
	EventCancelled = "cancelled"
	// EventRequeued is written by an operator's `jobreaper requeue`, in
	// the transaction that put the job back to QUEUED with its generation
	// raised; its detail holds the operator's reason and what was found.
	EventRequeued = "requeued"
)

// LateResultDetail is the detail of a late_result_rejected event.
type LateResultDetail struct {
	// Operation is the refused call: Complete, Fail, Advance, Heartbeat,
	// SetTotal, Release, AutoComplete or CheckCompleted.
	Operation string `json:"operation"`
	// FencingToken is the late attempt's "<job id>:<generation>".
	FencingToken string `json:"fencing_token"`
	// StaleGeneration is the generation the late attempt named.
	StaleGeneration int64 `json:"stale_generation"`
	// CurrentGeneration and CurrentStatus are the row's when the write was
	// refused; CurrentFailureReason is its failure code ("" when none).
	CurrentGeneration    int64  `json:"current_generation"`
	CurrentStatus        string `json:"current_status"`
	CurrentFailureReason string `json:"current_failure_reason,omitempty"`
	// Code is ErrorCode of the refusal: stale_worker or job_terminal.
	Code string `json:"code"`
}

// jobState is the part of a job row that tells why a fenced write matched
// nothing.
type jobState struct {
	Status        string
	Generation    int64
	FailureReason string
}

// lockedRead runs read, a statement that locks a job row by ID, and runs it
// once more when it found no row. A row deleted while the statement waited
// for its lock may have been replaced in the same transaction by a new
// life of the ID (the product deleted the row and inserted the ID again):
// under READ COMMITTED the waiting statement skips the deleted version and
// its snapshot cannot see the new row, so "no row" would be the wrong
// answer for a job that exists. The second statement takes a new snapshot
// and finds the new life, whose generation then refuses a superseded
// attempt as stale. A row that is really gone answers no row again.
func lockedRead(read func() error) error {
	err := read()
	if errors.Is(err, pgx.ErrNoRows) {
		err = read()
	}
	return err
}

const readStateSQL = `SELECT status, generation, coalesce(failure_reason, '') FROM {schema}.jobs WHERE id = $1`

// readState reads job id's state through q; it returns an error wrapping
// ErrNotFound when the row is missing.
func (s *Store) readState(ctx context.Context, q pgcore.RowQuerier, id string) (jobState, error) {
	var st jobState
	err := q.QueryRow(ctx, s.core.Q(readStateSQL), id).Scan(&st.Status, &st.Generation, &st.FailureReason)
	if errors.Is(err, pgx.ErrNoRows) {
		return st, fmt.Errorf("job %s: %w", id, ErrNotFound)
	}
	return st, err
}

// fenceError returns the typed error for a fenced write of lease that found
// the row in state st, or nil when st is PROCESSING at the lease's
// generation (the write should have matched). A QUEUED row at the lease's
// generation was released by that attempt: the attempt is over and the next
// claim makes a new generation, so it is answered as stale.
func fenceError(lease Lease, st jobState) error {
	switch {
	case st.Generation != lease.Generation:
		return fmt.Errorf("job %s: attempt %s was superseded by generation %d (status %s): %w",
			lease.JobID, lease.FencingToken(), st.Generation, st.Status, ErrStaleWorker)
	case st.Status == StatusCompleted || st.Status == StatusFailed:
		reason := ""
		if st.FailureReason != "" {
			reason = " (" + st.FailureReason + ")"
		}
		return fmt.Errorf("job %s is %s%s at generation %d: %w",
			lease.JobID, st.Status, reason, st.Generation, ErrJobTerminal)
	case st.Status == StatusQueued:
		return fmt.Errorf("job %s: attempt %s released the job to the queue: %w",
			lease.JobID, lease.FencingToken(), ErrStaleWorker)
	}
	return nil
}

// refuse answers a fenced write of lease that matched no row: it reads the
// row's state through q (the caller's transaction or the Store's handle),
// and when the attempt is stale or the job terminal it records a
// late_result_rejected event and returns the typed error. It returns
// (nil, st) when the row is PROCESSING at the lease's generation, which
// callers treat case by case (a heartbeat whose mark did not advance).
func (s *Store) refuse(ctx context.Context, q pgcore.RowQuerier, op string, lease Lease) (jobState, error) {
	st, err := s.readState(ctx, q, lease.JobID)
	if err != nil {
		return st, err
	}
	if ferr := fenceError(lease, st); ferr != nil {
		return st, s.rejectLate(ctx, op, lease, st, ferr)
	}
	return st, nil
}

const lateResultSQL = `
INSERT INTO {schema}.job_events (job_id, kind, generation, worker, detail)
VALUES ($1, 'late_result_rejected', $2, nullif($3, ''), $4)`

// rejectLate appends a late_result_rejected event for the refused write op
// of lease and returns refusal. The event goes through s.events, never
// through the caller's transaction (which the caller rolls back), with a
// timeout of its own and without the caller's cancellation: a zombie
// attempt often runs on a cancelled context, and its refusal is the very
// thing to record. When the event cannot be written the returned error
// wraps both, so errors.Is(err, ErrStaleWorker) and the like still hold.
func (s *Store) rejectLate(ctx context.Context, op string, lease Lease, st jobState, refusal error) error {
	s.metrics.lateRefused(op)
	detail, err := json.Marshal(LateResultDetail{
		Operation:            op,
		FencingToken:         lease.FencingToken(),
		StaleGeneration:      lease.Generation,
		CurrentGeneration:    st.Generation,
		CurrentStatus:        st.Status,
		CurrentFailureReason: st.FailureReason,
		Code:                 ErrorCode(refusal),
	})
	if err == nil {
		ectx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.core.OpTimeout())
		_, err = s.events.Exec(ectx, s.core.Q(lateResultSQL), lease.JobID, lease.Generation, lease.Worker, pgcore.JSONText(detail))
		cancel()
	}
	if err != nil {
		return fmt.Errorf("%w (recording the %s event failed: %w)", refusal, EventLateResultRejected, err)
	}
	return refusal
}

// appendEvent writes an event of kind for lease in tx, the transaction that
// changed the job, so that the event commits with the change or not at all.
func (s *Store) appendEvent(ctx context.Context, tx pgx.Tx, kind string, lease Lease, detail []byte) error {
	return s.core.AppendEvent(ctx, tx, lease.JobID, kind, lease.Generation, lease.Worker, detail)
}

// namedLease returns the named arguments @job_id and @generation of lease,
// plus the extra name/value pairs kv.
func namedLease(lease Lease, kv ...any) pgx.NamedArgs {
	args := pgx.NamedArgs{"job_id": lease.JobID, "generation": lease.Generation}
	for i := 0; i+1 < len(kv); i += 2 {
		args[kv[i].(string)] = kv[i+1]
	}
	return args
}
