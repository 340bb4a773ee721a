package jobs

import (
	"context"
	"math"
	"time"

	"github.com/jobreaper/jobreaper/internal/pgcore"
)

// Job statuses, as stored in jobs.status.
const (
	StatusQueued     = "QUEUED"
	StatusProcessing = "PROCESSING"
	StatusCompleted  = "COMPLETED"
	StatusFailed     = "FAILED"
)

// Snapshot is a job row as Get reads it, together with its type's limits:
// ID, Type, Status, Generation, FirstGeneration (see Lease), Worker, Queue
// and ParentID ("" when NULL), StartedAt (nil when the row was never
// claimed), UpdatedAt, FailureReason ("" when NULL), Limits (nil when no
// job_types row names the type) and Unreadable (what Go cannot represent
// of the row, such as an 'infinity' timestamp; "" for a row read whole).
// The reaper decides on the same type.
type Snapshot = pgcore.Snapshot

// Limits is a job_types row as Get reads it: MaxRuntime, StallTimeout (nil
// when NULL: the daemon's stall_timeout applies), HardTimeout (nil when
// NULL: HardTimeoutDefault applies) and AutoComplete. Intervals convert as
// PostgreSQL compares them (a month is 30 days, a day 24 hours; beyond
// about 292 years they saturate at MaxDuration).
type Limits = pgcore.Limits

// MaxDuration is the longest time.Duration, about 292 years: the value of
// a limit longer than that (Lease.MaxRuntime, Limits).
const MaxDuration = time.Duration(math.MaxInt64)

// HardTimeoutDefault is the hard_timeout of a job type whose column is NULL:
// the asynq Timeout the enqueue helper passes, a ceiling beyond which asynq
// cancels and retries a task whatever its progress.
const HardTimeoutDefault = 24 * time.Hour

// Get reads one job row and its type limits. It returns an error wrapping
// ErrNotFound when no row has that ID, and one wrapping ErrBadID (nothing
// sent) for an ID no row can have (CheckID: empty, a NUL byte, invalid
// UTF-8, over MaxIDLength), which PostgreSQL would answer with a driver
// error and the ID's raw bytes; otherwise a wrapped driver error or the
// operation's timeout.
func (s *Store) Get(ctx context.Context, id string) (Snapshot, error) {
	return s.core.Get(ctx, id)
}
