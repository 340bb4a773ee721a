package pgstore

import (
	"context"
	"encoding/json"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/jobreaper/jobreaper/internal/pgcore"
)

// StallRule holds the daemon-wide values the stall predicate needs besides
// the job_types row.
type StallRule struct {
	// DefaultStallTimeout applies to types whose stall_timeout is NULL.
	DefaultStallTimeout time.Duration
	// MinStallTimeout is 2 x heartbeat interval + scan interval: a type whose
	// stall timeout is below it would reap live workers between two of
	// their heartbeats, so its jobs are skipped as bad_limits.
	MinStallTimeout time.Duration
	// DefaultHardTimeout applies to types whose hard_timeout is NULL
	// (normally HardTimeoutDefault).
	DefaultHardTimeout time.Duration
	// OutageEnd is the end of the last PostgreSQL outage on the database
	// clock (Store.PassClock reads it): idle time never counts across an
	// outage, so it runs from the later of a job's updated_at and
	// OutageEnd. The zero value means none (the grace off): idle time runs
	// from updated_at alone, as '-infinity' does in SQL.
	OutageEnd time.Time
}

// InMicroseconds returns r with each duration truncated to whole
// microseconds: the rule as PostgreSQL receives it (an interval holds
// microseconds; see Interval). A rule read from a configuration may carry
// nanoseconds, and reaper.Decide judges with this form, so that a job idle
// for exactly the stall timeout gets the same verdict from Go as from
// StallPredicate.
func (r StallRule) InMicroseconds() StallRule {
	return StallRule{
		DefaultStallTimeout: r.DefaultStallTimeout.Truncate(time.Microsecond),
		MinStallTimeout:     r.MinStallTimeout.Truncate(time.Microsecond),
		DefaultHardTimeout:  r.DefaultHardTimeout.Truncate(time.Microsecond),
		OutageEnd:           r.OutageEnd.Truncate(time.Microsecond),
	}
}

func (r StallRule) args() pgx.NamedArgs {
	return pgx.NamedArgs{
		"default_stall": pgcore.Interval(r.DefaultStallTimeout),
		"min_stall":     pgcore.Interval(r.MinStallTimeout),
		"default_hard":  pgcore.Interval(r.DefaultHardTimeout),
		"outage_end":    outageEndArg(r.OutageEnd),
	}
}

// outageEndArg is StallRule.OutageEnd as StallPredicate's @outage_end:
// '-infinity' for none, which greatest() passes over.
func outageEndArg(end time.Time) pgtype.Timestamptz {
	if end.IsZero() {
		return pgtype.Timestamptz{InfinityModifier: pgtype.NegativeInfinity, Valid: true}
	}
	return pgtype.Timestamptz{Time: end, Valid: true}
}

// StallPredicate is the whole stall rule as SQL over jobs j joined with
// job_types t, on the database clock: the job is PROCESSING with a start
// time, its type's limits are sane (stall timeout at least @min_stall;
// hard_timeout longer than max_runtime + stall timeout), its runtime exceeds
// max_runtime and its idle time reaches the stall timeout, idle time counted
// from the later of updated_at and @outage_end (StallRule.OutageEnd,
// '-infinity' for none: no outage grace). Every SQL form of
// the rule (the reap UPDATE, set-based scans) uses this one fragment, and
// reaper.Decide states the same rule in Go; one boundary table tests both.
//
// The status is compared under COLLATE "C" (the same answer for an
// equality of these ASCII words) so that the clause does not match the
// predicate of the partial index jobs_processing_queue_idx: a statement
// that names jobs by ID then has the primary key as its only index,
// however stale the statistics (an analyzed-while-empty partial index
// looks free to the planner). A statement that wants that index, the
// lost-task search, names j.status = 'PROCESSING' itself.
//
// A started_at or updated_at of 'infinity' or '-infinity' (which other SQL
// can write) has no runtime or idle time: PostgreSQL refuses to subtract
// it ("cannot subtract infinite timestamps"), and one such row would fail
// every statement that meets it. The CASE, whose branches PostgreSQL
// evaluates in order (AND may be evaluated in any order), makes such a row
// not stalled (NULL); reaper.Decide skips it as bad_row.
//
// max_runtime + stall timeout is not computed as an interval: for limits
// such as '2000000000 months', or '70000000 mons -2100000000 days 1 hour'
// (an hour, written oddly), the sum's months or days overflow and
// PostgreSQL fails the statement ("interval out of range"), so one odd
// job_types row would stop the reaps of its whole batch and the lost-task
// search. Each interval is compared as an exact numeric of seconds
// instead, the way PostgreSQL compares intervals (30-day months, 24-hour
// days): extract(epoch) counts a year of months as 365.25 days, and
// 453600 s (5.25 days) per year, extract(year), takes that back.
const StallPredicate = `
      j.status COLLATE "C" = 'PROCESSING'
  AND j.started_at IS NOT NULL
  AND ` + limitsSafePredicate + `
  AND CASE WHEN isfinite(j.started_at) AND isfinite(j.updated_at)
           THEN now() - j.started_at > t.max_runtime
            AND now() - greatest(j.updated_at, @outage_end::timestamptz) >= coalesce(t.stall_timeout, @default_stall)
      END`

// limitsSafePredicate is the part of StallPredicate that checks the
// type's limits (t, of job_types): a stall timeout at least the floor, and
// a hard_timeout above max_runtime + stall timeout (NULL when the type is
// unknown).
const limitsSafePredicate = `coalesce(t.stall_timeout, @default_stall) >= @min_stall
  AND extract(epoch FROM coalesce(t.hard_timeout, @default_hard)) - 453600 * extract(year FROM coalesce(t.hard_timeout, @default_hard))
    > extract(epoch FROM t.max_runtime) - 453600 * extract(year FROM t.max_runtime)
    + extract(epoch FROM coalesce(t.stall_timeout, @default_stall)) - 453600 * extract(year FROM coalesce(t.stall_timeout, @default_stall))`

// ReapParams names the job to reap and the state it was read in.
type ReapParams struct {
	JobID string
	// Generation and UpdatedAt are the values read; the reap changes nothing
	// if either moved since.
	Generation int64
	UpdatedAt  time.Time
	// Reason is ReasonStalled or ReasonLostTask.
	Reason string
	Rule   StallRule
}

// Evidence records why a job was reaped, on the database clock. It is
// stored in the reaped event's detail.
type Evidence struct {
	Reason       string        `json:"reason"`
	Generation   int64         `json:"generation"`
	Worker       string        `json:"worker"`
	StartedAt    time.Time     `json:"started_at"`
	UpdatedAt    time.Time     `json:"updated_at"`
	Runtime      time.Duration `json:"-"`
	Idle         time.Duration `json:"-"`
	MaxRuntime   time.Duration `json:"-"`
	StallTimeout time.Duration `json:"-"`
	// MaxIdleGap is the attempt's longest progress gap, the idle time up
	// to the reap included: the greater of the row's max_idle_gap (kept by
	// the attempt's writes) and Idle. The reap does not write the column.
	MaxIdleGap time.Duration `json:"-"`
	// DBNow is the database's now() of the reap; the marker's 7 days run
	// from it.
	DBNow time.Time `json:"db_now"`
	// OutageEnd is the outage end the reap counted idle time from when it
	// was later than updated_at (StallRule.OutageEnd); nil otherwise.
	OutageEnd *time.Time `json:"outage_end,omitempty"`
	// DeadEarly: the job was reaped by the dead-early rule of a type with
	// reap_dead_early (its worker gone from asynq's registry and its task's
	// lease expired), before its runtime passed max_runtime.
	DeadEarly bool `json:"dead_early,omitempty"`
	// HolderID is the leader lease holder ID of the daemon whose reap
	// transaction checked the leader lease before COMMIT (WithLeaderLease):
	// the lease history names which replica reaped. Empty without a
	// leader lease (run --once, a dry run, a library caller).
	HolderID string `json:"holder_id,omitempty"`
	// Retry is true for a retry reap: the job was put back to QUEUED to
	// run again, not failed.
	Retry bool `json:"retry"`
	// ReapCount is the row's reap_count after the reap (a retry reap
	// raised it by one), and ReapRetries its type's reap_retries.
	ReapCount   int `json:"reap_count"`
	ReapRetries int `json:"reap_retries"`
	// ReapRetryImpossible is true for a failing reap whose job had budget
	// left but no task asynq could run again (gone from asynq).
	ReapRetryImpossible bool `json:"reap_retry_impossible,omitempty"`
}

func (e Evidence) detail() ([]byte, error) {
	type seconds struct {
		Evidence
		RuntimeSeconds      float64 `json:"runtime_seconds"`
		IdleSeconds         float64 `json:"idle_seconds"`
		MaxRuntimeSeconds   float64 `json:"max_runtime_seconds"`
		StallTimeoutSeconds float64 `json:"stall_timeout_seconds"`
		MaxIdleGapSeconds   float64 `json:"max_idle_gap_seconds"`
	}
	return json.Marshal(seconds{e, e.Runtime.Seconds(), e.Idle.Seconds(), e.MaxRuntime.Seconds(), e.StallTimeout.Seconds(), e.MaxIdleGap.Seconds()})
}

// Reap fails one stalled job with the compare-and-set of ReapBatch (one
// UPDATE whose WHERE repeats the read generation and updated_at and the
// whole StallPredicate against the current job_types row and now()); see
// ReapBatch for what the transaction writes. A job that progressed, was
// reclaimed, finished, or whose limits were raised since the read changes 0
// rows, and then nothing else is written.
//
// It returns reaped=false with a zero Evidence when the CAS matched nothing,
// and an error (nothing written) when PostgreSQL or a cascade failed; an
// error wrapping pgcore.ErrTxEnded (never reaped=true) when a cascade statement
// ended the transaction, so the UPDATE, the event and the cascade did not
// commit together.
func (s *Store) Reap(ctx context.Context, p ReapParams) (reaped bool, ev Evidence, err error) {
	ctx, done := s.core.Op(ctx, "Reap")
	res, err := s.reapBatch(ctx, ReapBatchParams{
		Candidates: []ReapCandidate{{JobID: p.JobID, Generation: p.Generation, UpdatedAt: p.UpdatedAt}},
		Reason:     p.Reason, Rule: p.Rule,
	})
	switch {
	case err != nil:
		return false, Evidence{}, done(err)
	case len(res.Failed) > 0:
		return false, Evidence{}, done(res.Failed[0].Err)
	case len(res.Reaped) == 0:
		return false, Evidence{}, done(nil)
	}
	return true, res.Reaped[0].Evidence, done(nil)
}
