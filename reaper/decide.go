package reaper

import (
	"fmt"
	"math"
	"time"

	"github.com/jobreaper/jobreaper/internal/pgstore"
	"github.com/jobreaper/jobreaper/jobs"
)

// SkipReason says why a pass left a job alone. The values are stable: they
// label metrics and the "skipped" object of `run --once --output json`.
type SkipReason string

// Skip reasons of Decide, in the order Decide checks them.
const (
	// SkipNoRow: an active task whose ID has no jobs row.
	SkipNoRow SkipReason = "no_row"
	// SkipNotProcessing: the row is QUEUED, COMPLETED or FAILED.
	SkipNotProcessing SkipReason = "not_processing"
	// SkipBadRow: the row is PROCESSING but holds a value the rule cannot
	// be applied to (jobs.Snapshot.Unreadable: a started_at or updated_at
	// of 'infinity' or '-infinity' written by other SQL). It is counted and
	// logged, never reaped, and never stops the rows read with it.
	SkipBadRow SkipReason = "bad_row"
	// SkipNoStartTime: the row is PROCESSING but started_at is NULL (it was
	// never claimed through the start guard), so its runtime is unknown.
	SkipNoStartTime SkipReason = "no_start_time"
	// SkipUnknownType: no job_types row names the job's type.
	SkipUnknownType SkipReason = "unknown_type"
	// SkipBadLimits: the type's limits cannot be applied safely: its stall
	// timeout is below 2 x heartbeat interval + scan interval (a live
	// worker would be reaped between two heartbeats), or its
	// hard_timeout is not longer than max_runtime + stall timeout (asynq
	// would cancel and retry the task before the reaper could see it).
	SkipBadLimits SkipReason = "bad_limits"
	// SkipWithinLimit: runtime has not exceeded the type's max_runtime.
	SkipWithinLimit SkipReason = "within_limit"
	// SkipProgressing: runtime exceeded max_runtime but updated_at moved
	// within the stall timeout.
	SkipProgressing SkipReason = "progressing"
	// SkipOutageGrace: the job is stalled by its idle time (now -
	// updated_at) but not by its idle time counted from the end of the last
	// PostgreSQL outage (pgstore.StallRule.OutageEnd): its worker could not
	// write a heartbeat while PostgreSQL was unreachable, so it is held
	// until one stall timeout after the outage ended.
	SkipOutageGrace SkipReason = "outage_grace"
)

// Skip reasons the pass adds around Decide.
const (
	// SkipNoJobID: an active entry whose task hash is gone lists with an
	// empty task ID; there is no job to decide on.
	SkipNoJobID SkipReason = "no_job_id"
	// SkipChangedSinceRead: Decide said reap but the compare-and-set
	// changed 0 rows: the job progressed, was reclaimed or finished, or its
	// type's limits were raised after the read.
	SkipChangedSinceRead SkipReason = "changed_since_read"
)

// Verdict is Decide's answer with the values it compared, for logs and the
// reaped event.
type Verdict struct {
	// Reap is true when the job is stalled; Skip is then "".
	Reap bool
	Skip SkipReason
	// Runtime is now - started_at; Idle is now - updated_at.
	Runtime, Idle time.Duration
	// MaxRuntime and StallTimeout are the limits applied (StallTimeout is the
	// type's, or the daemon default when the type's is NULL).
	MaxRuntime, StallTimeout time.Duration
	// Why says which rule a SkipBadLimits verdict broke, or which value a
	// SkipBadRow row holds, for the warning an operator acts on; ""
	// otherwise.
	Why string
}

// Decide is the stall rule in Go, with no I/O: a job is stalled when it is
// PROCESSING with a start time, its type's limits are sane, its runtime
// (now - started_at) exceeds max_runtime, and its idle time is at least the
// stall timeout, idle time counted from the later of updated_at and
// rule.OutageEnd (zero: from updated_at). A job stalled by now - updated_at
// alone is skipped as SkipOutageGrace. now must be the database clock's
// reading (pgstore.Store.PassClock), since started_at and updated_at were
// written by it. snap is nil when the task has no row.
//
// The rule is applied in whole microseconds (pgstore.StallRule.InMicroseconds),
// as PostgreSQL receives it: a configured duration with nanoseconds would
// otherwise move the boundary by less than a microsecond on one side only.
//
// pgstore.StallPredicate states the same rule in SQL; the boundary table in
// decide_test.go and FuzzDecideMatchesStallPredicate hold the two to the
// same answers.
func Decide(snap *jobs.Snapshot, now time.Time, rule pgstore.StallRule) Verdict {
	rule = rule.InMicroseconds()
	switch {
	case snap == nil:
		return Verdict{Skip: SkipNoRow}
	case snap.Status != jobs.StatusProcessing:
		return Verdict{Skip: SkipNotProcessing}
	case snap.Unreadable != "":
		return Verdict{Skip: SkipBadRow, Why: snap.Unreadable}
	case snap.StartedAt == nil:
		return Verdict{Skip: SkipNoStartTime, Idle: now.Sub(snap.UpdatedAt)}
	case snap.Limits == nil:
		return Verdict{Skip: SkipUnknownType, Runtime: now.Sub(*snap.StartedAt), Idle: now.Sub(snap.UpdatedAt)}
	}
	v := Verdict{
		Runtime:      now.Sub(*snap.StartedAt),
		Idle:         now.Sub(snap.UpdatedAt),
		MaxRuntime:   snap.Limits.MaxRuntime,
		StallTimeout: rule.DefaultStallTimeout,
	}
	if snap.Limits.StallTimeout != nil {
		v.StallTimeout = *snap.Limits.StallTimeout
	}
	hard := rule.DefaultHardTimeout
	if snap.Limits.HardTimeout != nil {
		hard = *snap.Limits.HardTimeout
	}
	// The comparisons run in whole microseconds, exact far beyond
	// time.Duration's 292 years (the Verdict's durations stop there): a
	// limit of '1000 years' against a started_at of 0001-01-01 gets
	// StallPredicate's answer.
	maxUs, stallUs, hardUs := pgstore.LimitsMicros(snap.Limits)
	if stallUs == nil {
		stallUs = ptr(rule.DefaultStallTimeout.Microseconds())
	}
	if hardUs == nil {
		hardUs = ptr(rule.DefaultHardTimeout.Microseconds())
	}
	switch {
	case *stallUs < rule.MinStallTimeout.Microseconds():
		v.Skip = SkipBadLimits
		v.Why = fmt.Sprintf("stall timeout %s is below 2 x heartbeat interval + scan interval = %s", v.StallTimeout, rule.MinStallTimeout)
	case *hardUs <= pgstore.AddMicros(maxUs, *stallUs):
		v.Skip = SkipBadLimits
		v.Why = fmt.Sprintf("hard_timeout %s is not longer than max_runtime + stall timeout = %s: asynq would cancel and retry the task first",
			hard, sumDuration(v.MaxRuntime, v.StallTimeout))
	case microsBetween(*snap.StartedAt, now) <= maxUs:
		v.Skip = SkipWithinLimit
	case microsBetween(snap.UpdatedAt, now) < *stallUs:
		v.Skip = SkipProgressing
	case !rule.OutageEnd.IsZero() && rule.OutageEnd.After(snap.UpdatedAt) && microsBetween(rule.OutageEnd, now) < *stallUs:
		v.Skip = SkipOutageGrace
	default:
		v.Reap = true
	}
	return v
}

func ptr[T any](v T) *T { return &v }

// microsBetween returns to - from in whole microseconds (the database's
// timestamps hold microseconds), saturated at the int64 bounds rather than
// at time.Duration's 292 years.
func microsBetween(from, to time.Time) int64 {
	if d := to.Sub(from); d > math.MinInt64 && d < math.MaxInt64 {
		return d.Microseconds()
	}
	secs := to.Unix() - from.Unix()
	if secs > math.MaxInt64/1_000_000 {
		return math.MaxInt64
	}
	if secs < math.MinInt64/1_000_000 {
		return math.MinInt64
	}
	return pgstore.AddMicros(secs*1_000_000, int64(to.Nanosecond()/1e3-from.Nanosecond()/1e3))
}

// sumDuration returns a + b, saturated at jobs.MaxDuration for a message.
func sumDuration(a, b time.Duration) time.Duration {
	if a > 0 && b > jobs.MaxDuration-a {
		return jobs.MaxDuration
	}
	return a + b
}
