package jobs

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
)

// HeartbeatIntervalDefault is how often, at most, one process writes a
// heartbeat for one job: once per 5 minutes. The number is a trade-off
// between two limits:
//
//   - Load: handlers call Heartbeat on every item (for example 2,000 jobs at about
//     10 calls a second each). Unthrottled that is 20,000 UPDATEs a second on
//     the hottest rows of the table; at one per 5 minutes it is at most 2 per
//     job over 10 minutes.
//   - Detection: a live job's updated_at may then lag its real progress by up
//     to one interval, so the stall timeout must be at least 2 x this
//     interval + the reaper's scan interval (11 minutes with 1-minute scans;
//     the baseline stall timeout is 15 minutes). A longer interval would push
//     every stall timeout, and so the time a hung job goes unnoticed, up.
//
// Advance is never throttled: a committed batch moves updated_at every time.
const HeartbeatIntervalDefault = 5 * time.Minute

// Clock is the time source of the heartbeat limiter: the one method of
// clockwork.Clock (github.com/jonboulle/clockwork) it needs, so that
// clockwork's real and fake clocks plug in while this package does not
// depend on clockwork. A nil Clock means the host clock. The limiter
// compares only readings of this clock with each other, never with database
// timestamps.
type Clock interface {
	Now() time.Time
}

type hostClock struct{}

func (hostClock) Now() time.Time { return time.Now() }

// HeartbeatResult says what one Heartbeat call did.
type HeartbeatResult struct {
	// Throttled: this process sent a heartbeat for the job less than one
	// interval ago, so no statement was sent.
	Throttled bool
	// Sent: an UPDATE was sent to PostgreSQL (it may still have matched 0
	// rows).
	Sent bool
	// Written: the UPDATE moved updated_at and progress_mark. False with a
	// nil error means the mark did not advance past the stored one.
	Written bool
}

// HeartbeatStats counts a Heartbeater's calls since it was created.
type HeartbeatStats struct {
	// Calls is every Heartbeat call; Throttled, those the limiter skipped;
	// Sent, those that sent an UPDATE; Written, those whose UPDATE moved the
	// row; Refused, those answered ErrStaleWorker or ErrJobTerminal; Failed,
	// those that ended in any other error.
	Calls, Throttled, Sent, Written, Refused, Failed uint64
}

// Heartbeater writes heartbeats for the jobs of one process, at most one per
// job per interval. It is safe for concurrent use; create one per process
// and share it between handlers.
type Heartbeater struct {
	store    *Store
	clock    Clock
	interval time.Duration

	mu sync.Mutex
	// last maps a job ID to the time of its last attempt (sent, whatever the
	// outcome). Entries at least one interval old no longer throttle and are
	// dropped by sweep, so the map holds only jobs seen within the last two
	// intervals.
	last      map[string]time.Time
	lastSweep time.Time

	calls, throttled, sent, written, refused, failed atomic.Uint64
}

// NewHeartbeater returns a Heartbeater writing through store. clock is the
// limiter's time source (nil: the host clock; tests pass a fake clock).
// interval is the least time between two heartbeat writes of one job from
// this process; 0 means HeartbeatIntervalDefault.
//
// It returns an error wrapping ErrInvalidArgument when store is nil or
// interval is negative; nothing is clamped.
func NewHeartbeater(store *Store, clock Clock, interval time.Duration) (*Heartbeater, error) {
	if store == nil {
		return nil, fmt.Errorf("jobs.NewHeartbeater: store is nil: %w", ErrInvalidArgument)
	}
	if interval < 0 {
		return nil, fmt.Errorf("jobs.NewHeartbeater: interval %s is negative; use 0 for the default %s: %w",
			interval, HeartbeatIntervalDefault, ErrInvalidArgument)
	}
	if interval == 0 {
		interval = HeartbeatIntervalDefault
	}
	if clock == nil {
		clock = hostClock{}
	}
	return &Heartbeater{store: store, clock: clock, interval: interval, last: make(map[string]time.Time)}, nil
}

// Interval returns the least time between two heartbeat writes of one job.
func (h *Heartbeater) Interval() time.Duration { return h.interval }

// Heartbeat reports that lease's attempt is alive and has reached progress,
// a mark that only grows (items done, bytes encoded, polls answered; the
// claim resets the stored mark to 0, so the first mark is 1 or more).
//
// The limiter lets one call per job through per interval; that call is
// recorded before it is sent, so concurrent calls for one job make at most
// one write, and a write that fails or matches 0 rows still uses up the
// interval (an outage does not turn into a retry storm). Throttled calls
// return Throttled and send nothing.
//
// The UPDATE is fenced: it moves updated_at to the database's now() and
// stores progress only when the row is PROCESSING at the lease's generation
// and progress is greater than the stored progress_mark, so an idle ticker
// repeating one mark cannot keep a hung job alive. Such a call returns
// Written=false and a nil error.
//
// Errors: ErrStaleWorker when a newer attempt claimed the job (or this one
// released it), ErrJobTerminal when the job is COMPLETED or FAILED; both
// record a late_result_rejected event. ErrNotFound when the row is missing;
// otherwise a wrapped driver error or the operation's timeout.
func (h *Heartbeater) Heartbeat(ctx context.Context, lease Lease, progress int64) (HeartbeatResult, error) {
	h.calls.Add(1)
	if !h.reserve(lease.JobID) {
		h.throttled.Add(1)
		return HeartbeatResult{Throttled: true}, nil
	}
	h.sent.Add(1)
	written, err := h.store.heartbeat(ctx, lease, progress)
	switch {
	case err == nil && written:
		h.written.Add(1)
	case ErrorCode(err) != "":
		h.refused.Add(1)
	case err != nil:
		h.failed.Add(1)
	}
	return HeartbeatResult{Sent: true, Written: written}, err
}

// reserve records an attempt for jobID and reports whether the limiter lets
// it through: no attempt of the same job in the last interval.
func (h *Heartbeater) reserve(jobID string) bool {
	now := h.clock.Now()
	h.mu.Lock()
	defer h.mu.Unlock()
	if now.Sub(h.lastSweep) >= h.interval {
		h.sweep(now)
	}
	if at, ok := h.last[jobID]; ok && now.Sub(at) < h.interval {
		return false
	}
	h.last[jobID] = now
	return true
}

// sweep drops the entries that no longer throttle; h.mu is held. It runs at
// most once per interval, so its cost is amortised over the calls.
func (h *Heartbeater) sweep(now time.Time) {
	for id, at := range h.last {
		if now.Sub(at) >= h.interval {
			delete(h.last, id)
		}
	}
	h.lastSweep = now
}

// Tracked returns how many jobs the limiter currently remembers. Entries
// older than one interval are dropped, so it stays near the number of jobs
// that sent a heartbeat within the last two intervals.
func (h *Heartbeater) Tracked() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.last)
}

// Stats returns the Heartbeater's counters.
func (h *Heartbeater) Stats() HeartbeatStats {
	return HeartbeatStats{
		Calls: h.calls.Load(), Throttled: h.throttled.Load(), Sent: h.sent.Load(),
		Written: h.written.Load(), Refused: h.refused.Load(), Failed: h.failed.Load(),
	}
}

// heartbeatSQL is the fenced heartbeat and, in the same round trip, the
// row's state, which tells a mark that did not advance from an attempt that
// is over. The outer SELECT reads the row as it was before the UPDATE; a
// heartbeat changes neither status nor generation.
const heartbeatSQL = `
WITH beat AS (
    UPDATE {schema}.jobs
       SET updated_at = now(), progress_mark = @progress
     WHERE id = @job_id
       AND status = 'PROCESSING'
       AND generation = @generation
       AND progress_mark < @progress
 RETURNING 1
)
SELECT EXISTS (SELECT 1 FROM beat), status, generation, coalesce(failure_reason, '')
  FROM {schema}.jobs WHERE id = @job_id`

// heartbeat is the fenced heartbeat write, unthrottled: only Heartbeater
// calls it.
func (s *Store) heartbeat(ctx context.Context, lease Lease, progress int64) (bool, error) {
	ctx, done := s.op(ctx, "Heartbeat")
	var (
		written bool
		st      jobState
	)
	err := s.db.QueryRow(ctx, s.q(heartbeatSQL), namedLease(lease, "progress", progress)).
		Scan(&written, &st.Status, &st.Generation, &st.FailureReason)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, done(fmt.Errorf("job %s: %w", lease.JobID, ErrNotFound))
	}
	if err != nil || written {
		return written, done(err)
	}
	// 0 rows: the mark did not advance (no error), or the attempt is over.
	if ferr := fenceError(lease, st); ferr != nil {
		return false, done(s.rejectLate(ctx, "Heartbeat", lease, st, ferr))
	}
	return false, done(nil)
}
