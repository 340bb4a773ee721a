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
// heartbeat for one attempt of a job: once per 5 minutes. The number is a
// trade-off between two limits:
//
//   - Load: handlers call Heartbeat on every item (for example 2,000 jobs at about
//     10 calls a second each). Unthrottled that is 20,000 UPDATEs a second on
//     the hottest rows of the table; at one per 5 minutes it is at most 2 per
//     attempt over 10 minutes.
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
	// Throttled: no statement was sent, because this process sent a
	// heartbeat for the same attempt less than one interval ago, or that
	// heartbeat failed less than its backoff ago, or it is still waiting
	// for its answer.
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
	// Calls is every Heartbeat call; Throttled, those the limiter skipped
	// (within the interval, within a failed write's backoff, or while the
	// attempt's write was in flight); Sent, those that sent an UPDATE;
	// Written, those whose UPDATE moved the row; Refused, those answered
	// ErrStaleWorker or ErrJobTerminal (sent, or answered from the
	// attempt's recorded refusal); Failed, those that ended in any other
	// error (a failed write, which the limiter retries after its backoff),
	// including a call whose context was already done. Calls is Throttled
	// plus Sent plus the calls answered without a round trip (a recorded
	// refusal, a context already done).
	Calls, Throttled, Sent, Written, Refused, Failed uint64
}

// Heartbeater writes heartbeats for the attempts running in one process, at
// most one per attempt per interval. It is safe for concurrent use; create
// one per process and share it between handlers.
type Heartbeater struct {
	store    *Store
	clock    Clock
	interval time.Duration

	mu sync.Mutex
	// last maps an attempt to what the limiter remembers of it. Entries
	// whose last heartbeat is at least one interval old no longer throttle
	// and are dropped by sweep (unless a write is in flight or a backoff
	// not yet passed), so the map holds only attempts seen within the last
	// two intervals.
	last map[attemptKey]attemptEntry
	// newest maps a job ID to the highest generation in last, so that an
	// attempt superseded by one that heartbeats from this process is found
	// without a scan. sweep rebuilds it.
	newest    map[string]int64
	lastSweep time.Time

	calls, throttled, sent, written, refused, failed atomic.Uint64
}

// NewHeartbeater returns a Heartbeater writing through store. clock is the
// limiter's time source (nil: the host clock; tests pass a fake clock).
// interval is the least time between two heartbeat writes of one attempt
// from this process; 0 means HeartbeatIntervalDefault.
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
	return &Heartbeater{
		store: store, clock: clock, interval: interval,
		last: make(map[attemptKey]attemptEntry), newest: make(map[string]int64),
	}, nil
}

// Interval returns the least time between two heartbeat writes of one
// attempt.
func (h *Heartbeater) Interval() time.Duration { return h.interval }

// Heartbeat reports that lease's attempt is alive and has reached progress,
// a mark that only grows (items done, bytes encoded, polls answered; the
// claim resets the stored mark to 0, so the first mark is 1 or more).
//
// The limiter is keyed by attempt (job ID and the lease's generation): it
// lets one call per attempt through per interval, so a superseded attempt
// still calling from this process never uses up the live attempt's window.
// Once a newer attempt of the same job has heartbeated from this process,
// one throttled call of the older attempt is let through anyway, so that
// PostgreSQL refuses it at once instead of its calls being answered as
// merely throttled until its window ends.
// The call let through is recorded before it is sent, and no other call of
// the attempt is let through until its answer came back, so concurrent
// calls of one attempt make at most one write, and an attempt never has
// two writes in flight however long one takes. Throttled calls return
// Throttled and send nothing. A call whose ctx is already done sends
// nothing and uses up nothing: it returns ctx's error.
//
// A write PostgreSQL answered, whether it moved the row or matched nothing,
// uses up the attempt's interval. A write that failed (PostgreSQL
// unreachable, a broken connection, the operation's timeout: any error but
// a refusal) does not: the attempt's next call is let through once a
// backoff has passed since the failure, which starts at the lesser of 1 s
// and a fifth of the interval and doubles at each further failure, up to a
// fifth of the interval (1 s, 2 s, 4 s, ... 60 s with the 5-minute
// default). So a live attempt's progress lands within one backoff of the
// database coming back rather than up to an interval later, and an outage
// costs at most one write per attempt per backoff step, never a storm.
// The backoff is measured on the Heartbeater's clock. It only shortens the
// lag after an outage: what keeps the reaper from failing live jobs whose
// heartbeats an outage held back is the daemon's outage grace (idle time
// never counts across a PostgreSQL outage), not this retry.
//
// The UPDATE is fenced: it moves updated_at to the database's now() and
// stores progress only when the row is PROCESSING at the lease's generation
// and progress is greater than the stored progress_mark, so an idle ticker
// repeating one mark cannot keep a hung job alive. The same UPDATE keeps
// the attempt's longest progress gap (jobs.max_idle_gap: the longest time
// between two recorded writes of the attempt), so a heartbeat is still one
// statement. Such a call returns
// Written=false and a nil error. The answer reflects the row after any
// write the heartbeat waited for (a reap or a claim holding the row).
//
// Errors: ErrStaleWorker when a newer attempt claimed the job (or this one
// released it), ErrJobTerminal when the job is COMPLETED or FAILED; both
// record a late_result_rejected event, and the Heartbeater remembers the
// refusal: later calls of the same attempt return it (wrapped, Sent false)
// without a round trip while the attempt's entry lives. ErrNotFound when
// the row is missing; ctx's error (wrapped) when ctx was done before the
// call; otherwise a wrapped driver error or the operation's timeout.
func (h *Heartbeater) Heartbeat(ctx context.Context, lease Lease, progress int64) (HeartbeatResult, error) {
	h.calls.Add(1)
	key := attemptKey{lease.JobID, lease.Generation}
	switch v, refusal := h.reserve(ctx, key); v {
	case verdictRefused:
		h.refused.Add(1)
		h.store.metrics.lateRefused("Heartbeat")
		return HeartbeatResult{}, fmt.Errorf("jobs.Heartbeat: attempt %s was refused before, nothing sent: %w", lease.FencingToken(), refusal)
	case verdictDone:
		h.failed.Add(1)
		return HeartbeatResult{}, fmt.Errorf("jobs.Heartbeat: attempt %s: context done before the call, nothing sent: %w", lease.FencingToken(), ctx.Err())
	case verdictThrottled:
		h.throttled.Add(1)
		h.store.metrics.heartbeat(HeartbeatThrottled)
		return HeartbeatResult{Throttled: true}, nil
	}
	h.sent.Add(1)
	written, err := h.store.heartbeat(ctx, lease, progress)
	refused := errors.Is(err, ErrStaleWorker) || errors.Is(err, ErrJobTerminal)
	h.answered(key, err, refused)
	switch {
	case err == nil && written:
		h.written.Add(1)
		h.store.metrics.heartbeat(HeartbeatWritten)
	case err == nil:
		h.store.metrics.heartbeat(HeartbeatUnchanged)
	case refused:
		h.refused.Add(1)
	default:
		h.failed.Add(1)
	}
	return HeartbeatResult{Sent: true, Written: written}, err
}

// Tracked returns how many attempts the limiter currently remembers.
// Entries older than one interval are dropped (unless their write is still
// in flight or their backoff after a failed write has not passed), so it
// stays near the number of attempts that sent a heartbeat within the last
// two intervals.
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
// row's state that tells a mark that did not advance from an attempt that
// is over. The state is read under the row lock (cur), never from the
// statement's starting snapshot: a heartbeat that waited for a reap or a
// claim holding the row must answer with the row that write left, not the
// one it started from (in READ COMMITTED, a locking read returns the
// latest committed version). The UPDATE repeats the fence on the row
// itself; after the lock nothing can change it in between. The same
// UPDATE keeps the attempt's longest progress gap (keepIdleGapSQL), so
// the evidence costs no statement of its own.
const heartbeatSQL = `
WITH cur AS (
    SELECT id, status, generation, coalesce(failure_reason, '') AS failure_reason, progress_mark
      FROM {schema}.jobs WHERE id = @job_id
       FOR NO KEY UPDATE
), beat AS (
    UPDATE {schema}.jobs j
       SET updated_at = now(), progress_mark = @progress, ` + keepIdleGapSQL + `
      FROM cur
     WHERE j.id = cur.id
       AND cur.status = 'PROCESSING' AND cur.generation = @generation AND cur.progress_mark < @progress
       AND j.status = 'PROCESSING' AND j.generation = @generation AND j.progress_mark < @progress
 RETURNING 1
)
SELECT EXISTS (SELECT 1 FROM beat), status, generation, failure_reason FROM cur`

// heartbeat is the fenced heartbeat write, unthrottled: only Heartbeater
// calls it.
func (s *Store) heartbeat(ctx context.Context, lease Lease, progress int64) (bool, error) {
	ctx, done := s.core.Op(ctx, "Heartbeat")
	var (
		written bool
		st      jobState
	)
	err := lockedRead(func() error {
		return s.core.DB().QueryRow(ctx, s.core.Q(heartbeatSQL), namedLease(lease, "progress", progress)).
			Scan(&written, &st.Status, &st.Generation, &st.FailureReason)
	})
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
