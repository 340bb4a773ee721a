package jobs

import (
	"context"
	"time"

	"github.com/jobreaper/jobreaper/internal/broken"
)

// This file holds the Heartbeater's limiter: what it remembers of each
// attempt, and the decision to send a call or throttle it.

// attemptKey identifies one attempt: the job and the generation its claim
// gave it. Everything the Heartbeater remembers belongs to an attempt, not
// to a job: a superseded attempt of a job, or an earlier life of its ID,
// may still be calling from the same process while the live attempt runs.
type attemptKey struct {
	jobID      string
	generation int64
}

// attemptEntry is what the limiter remembers of one attempt.
type attemptEntry struct {
	// at is when the attempt's last heartbeat was let through (sent,
	// whatever the outcome).
	at time.Time
	// sending: the call let through at is still waiting for its answer.
	// No other call of the attempt is let through meanwhile, and sweep
	// keeps the entry however long the write takes.
	sending bool
	// failed: the attempt's last write ended in an error other than a
	// refusal (PostgreSQL unreachable, a timeout). The next call is let
	// through at retryAt instead of one interval after at; backoff is the
	// pause that led to retryAt, doubled at each further failure.
	failed  bool
	backoff time.Duration
	retryAt time.Time
	// refusal is set once PostgreSQL refused the attempt (ErrStaleWorker or
	// ErrJobTerminal): a fence that refused an attempt never lets it
	// through again, so later calls get the same answer without a round
	// trip.
	refusal error
	// probed: a throttled call of this attempt was let through because a
	// newer attempt of the job heartbeats from this process (see reserve);
	// at most once per entry, so an outage cannot make it a storm.
	probed bool
}

// verdict is the limiter's decision on one call.
type verdict int

const (
	// verdictSend: the attempt has no write in flight, and its last write
	// is at least one interval old (or failed at least its backoff ago);
	// the call is recorded and goes to PostgreSQL.
	verdictSend verdict = iota
	// verdictThrottled: the attempt has a write in flight, sent one less
	// than one interval ago, or had one fail less than its backoff ago.
	verdictThrottled
	// verdictRefused: PostgreSQL refused the attempt before.
	verdictRefused
	// verdictDone: the call's context is already done; nothing is recorded.
	verdictDone
)

// reserve decides a call of attempt key and, for verdictSend, records it
// as sending; with verdictRefused it returns the attempt's recorded
// refusal.
func (h *Heartbeater) reserve(ctx context.Context, key attemptKey) (verdict, error) {
	now := h.clock.Now()
	h.mu.Lock()
	defer h.mu.Unlock()
	if now.Sub(h.lastSweep) >= h.interval {
		h.sweep(now)
	}
	e, ok := h.last[key]
	switch {
	case ok && e.refusal != nil:
		return verdictRefused, e.refusal
	case ctx.Err() != nil:
		return verdictDone, nil
	case ok && e.sending:
		return verdictThrottled, nil
	case ok && h.waiting(e, now):
		if e.probed || h.newest[key.jobID] <= key.generation {
			return verdictThrottled, nil
		}
		// A newer attempt of this job heartbeats here: this one is
		// superseded, and one round trip lets PostgreSQL say so.
		e.probed, e.sending = true, true
		h.last[key] = e
		return verdictSend, nil
	case ok && e.failed:
		// The backoff after a failed write has passed: retry, keeping the
		// backoff so that another failure doubles it.
		e.at, e.sending = now, true
		h.last[key] = e
		return verdictSend, nil
	}
	h.last[key] = attemptEntry{at: now, sending: true}
	if key.generation > h.newest[key.jobID] {
		h.newest[key.jobID] = key.generation
	}
	return verdictSend, nil
}

// waiting reports whether an attempt whose entry is e, with no write in
// flight, must not send at now: its last write failed less than its
// backoff ago, or went through less than one interval ago.
func (h *Heartbeater) waiting(e attemptEntry, now time.Time) bool {
	if e.failed {
		return now.Before(e.retryAt)
	}
	return now.Sub(e.at) < h.interval
}

// answered records the answer to attempt key's write: err nil (the write
// went through, moved the row or not), a refusal (remembered while the
// entry lives), or
// a failure, which sets the backoff before the attempt's next write.
func (h *Heartbeater) answered(key attemptKey, err error, refused bool) {
	now := h.clock.Now()
	h.mu.Lock()
	defer h.mu.Unlock()
	e, ok := h.last[key]
	if !ok {
		return // not reachable: sweep keeps an entry while it is sending
	}
	e.sending = false
	switch {
	case err == nil:
		e.failed, e.backoff, e.retryAt = false, 0, time.Time{}
	case refused:
		e.refusal = err
	case broken.HeartbeatRetry:
		e.at = now // the failure uses up the interval: no retry
	default:
		e.failed, e.backoff = true, h.nextBackoff(e.backoff)
		e.retryAt = now.Add(e.backoff)
	}
	h.last[key] = e
}

// nextBackoff returns the pause after a failed write whose previous pause
// was prev (0 for the first failure): the lesser of 1 s and a fifth of the
// interval, doubled at each further failure up to a fifth of the interval.
// A fifth keeps the retries of an outage well inside one interval, so
// the first write after it lands long before the 2-interval part of the
// stall-timeout floor is used up; 1 s keeps a long interval's first retry
// prompt without turning a refused connection into a busy loop.
func (h *Heartbeater) nextBackoff(prev time.Duration) time.Duration {
	limit := max(h.interval/5, time.Nanosecond)
	if prev == 0 {
		return min(time.Second, limit)
	}
	return min(2*prev, limit)
}

// sweep drops the entries that no longer throttle and rebuilds newest from
// the rest; h.mu is held. It runs at most once per interval, so its cost is
// amortised over the calls. An entry whose write is in flight, or whose
// failed write's backoff has not passed, is kept whatever its age. A
// refused attempt's entry goes too: its next call is sent and refused
// again, which records one late_result_rejected event per interval at
// most.
func (h *Heartbeater) sweep(now time.Time) {
	clear(h.newest)
	for key, e := range h.last {
		if !e.sending && now.Sub(e.at) >= h.interval && !now.Before(e.retryAt) {
			delete(h.last, key)
			continue
		}
		if key.generation > h.newest[key.jobID] {
			h.newest[key.jobID] = key.generation
		}
	}
	h.lastSweep = now
}
