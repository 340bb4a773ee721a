package jobs

import (
	"context"
	"fmt"
	"strconv"
	"time"
)

// Lease is what a claim returns: the identity of one attempt. Every fenced
// write names its JobID and Generation.
type Lease struct {
	// JobID is the job's ID, which is also its asynq task ID.
	JobID string
	// Generation is the fencing token of this attempt: the job's generation
	// after the claim incremented it.
	Generation int64
	// Worker names the process that claimed the attempt.
	Worker string
	// Type is the job's type (a job_types name).
	Type string
	// Queue, ParentID and TenantID are copied from the row ("" when NULL).
	Queue, ParentID, TenantID string
	// Cursor is where resumable progress stood at the claim: the next
	// attempt resumes here.
	Cursor int64
	// Total is the number of items the job covers (0 when the row has none).
	Total int64
	// StartedAt is the attempt's start on the database clock.
	StartedAt time.Time
	// FirstGeneration is the generation the job's current life started at
	// (jobs.first_generation): 0 for an ID's first life inserted with the
	// default generation, and above every generation of the ID's earlier
	// lives when the product deleted the row and inserted the ID again (see
	// docs/schema.md, "A job ID's lives"). Generation is at or above it.
	FirstGeneration int64
	// MaxRuntime is the type's max_runtime (job_types) as the claim read
	// it, in the same statement: the runtime after which the reaper may
	// fail the attempt once it is idle for the stall timeout. Intervals
	// convert as PostgreSQL compares them (a month is 30 days, a day 24
	// hours; beyond about 292 years it saturates at MaxDuration). 0 when no
	// job_types row names the job's type: the reaper skips such a job as
	// unknown_type. Set by Claim and Admit; zero in a Lease built otherwise.
	MaxRuntime time.Duration
	// StallTimeout is the type's own stall_timeout as the claim read it,
	// converted as MaxRuntime is; 0 when the type leaves it NULL (the
	// daemon's stall_timeout setting applies, which the worker library does
	// not know) or has no job_types row. Set by Claim and Admit.
	StallTimeout time.Duration
}

// FencingToken returns "<job id>:<generation>". It changes with every
// attempt: give it to other systems that must refuse writes of an older
// attempt. It differs between the lives of a reused job ID too, since a new
// life's generations start above every earlier one's.
func (l Lease) FencingToken() string {
	return l.JobID + ":" + strconv.FormatInt(l.Generation, 10)
}

// IdempotencyKey returns "<job id>:<step>" in the first life of a job ID
// (FirstGeneration 0), and "<job id>@<first generation>:<step>" in a later
// one. It is the same for every attempt of one life: give it to an external
// API (a model call, a payment) so that a retried attempt is not billed
// twice for the same step. It differs between lives, so a job ID the
// product deletes and inserts again ("run this report again") is billed
// again. A job in flight when the lives migration was applied has
// FirstGeneration 0 and keeps its key.
func (l Lease) IdempotencyKey(step string) string {
	if l.FirstGeneration > 0 {
		return fmt.Sprintf("%s@%d:%s", l.JobID, l.FirstGeneration, step)
	}
	return fmt.Sprintf("%s:%s", l.JobID, step)
}

type leaseKey struct{}

// WithLease returns a copy of ctx that carries lease. The start guard calls
// it before running the handler.
func WithLease(ctx context.Context, lease Lease) context.Context {
	return context.WithValue(ctx, leaseKey{}, lease)
}

// LeaseFromContext returns the lease the start guard put into ctx, or
// ErrNoLease when the handler did not run under the guard.
func LeaseFromContext(ctx context.Context) (Lease, error) {
	l, ok := ctx.Value(leaseKey{}).(Lease)
	if !ok {
		return Lease{}, ErrNoLease
	}
	return l, nil
}
