// Package limits turns what a job type's finished attempts measured (the
// p99 of their runtimes and of their longest progress gaps) into suggested
// limits: max_runtime, stall_timeout and, where those would break the rule
// that hard_timeout exceeds max_runtime + stall timeout, hard_timeout. It
// is pure: `jobreaper suggest-limits` and the status page read the
// measurements (internal/pgstore) and print what Suggest returns.
package limits

import (
	"fmt"
	"strings"
	"time"
)

// MinAttempts is the fewest finished attempts of a type in the window for
// which Suggest suggests anything: the p99 of fewer than 100 values is a
// blend of the top two, so one odd attempt would set the limit.
const MinAttempts = 100

// Factors of the suggestion. A max_runtime of 1.25 x the p99 runtime leaves
// a quarter of headroom over what 99 attempts in 100 need; a stall timeout
// of 2 x the p99 longest gap lets a live worker go twice as long without
// progress as nearly all did.
const (
	runtimeHeadroom = 1.25
	gapHeadroom     = 2
)

// Input is what Suggest works from. Durations are positive or zero.
type Input struct {
	// Type names the job type, for the SQL.
	Type string
	// Table is the job_types table as the SQL must name it, schema
	// qualified and quoted (pgx.Identifier.Sanitize).
	Table string
	// Attempts counts the finished attempts (completed, failed by their
	// handler) of the window.
	Attempts int
	// RuntimeP99 is the p99 runtime of those attempts; GapP99 the p99 of
	// their longest progress gaps, the gaps of jobs reaped while alive
	// included.
	RuntimeP99, GapP99 time.Duration
	// HeartbeatInterval is the workers' heartbeat interval;
	// MinStallTimeout the stall rule's floor (2 x heartbeat + interval).
	HeartbeatInterval, MinStallTimeout time.Duration
	// MaxRuntime, StallTimeout and HardTimeout are the type's limits as
	// the daemon applies them (a NULL stall timeout is the daemon's
	// default, a NULL hard timeout 24 h).
	MaxRuntime, StallTimeout, HardTimeout time.Duration
}

// Suggestion is what Suggest returns. With Enough false, the durations are
// zero and SQL is empty: Note says why.
type Suggestion struct {
	Enough                   bool
	MaxRuntime, StallTimeout time.Duration
	// HardTimeout is zero unless the suggested max_runtime + stall timeout
	// reach the type's hard_timeout (the type would be skipped as
	// bad_limits); then it is the hard_timeout to set with them.
	HardTimeout time.Duration
	// SQL is one UPDATE job_types statement applying the suggestion.
	SQL string
	// Note says what to know before applying it: not enough data, or that
	// a new hard_timeout applies to newly enqueued tasks only.
	Note string
}

// Suggest computes the suggested limits of one type:
//
//   - max_runtime: 1.25 x RuntimeP99 rounded up to a whole minute, and at
//     least RuntimeP99 + HeartbeatInterval (then rounded up likewise);
//   - stall_timeout: 2 x GapP99 rounded up to a whole minute, and at least
//     MinStallTimeout;
//   - hard_timeout, only where HardTimeout would not exceed the suggested
//     max_runtime + stall_timeout: max_runtime + 2 x stall_timeout, which
//     leaves a whole stall timeout between the reaper's rule and asynq's
//     kill.
//
// With fewer than MinAttempts attempts it suggests nothing.
func Suggest(in Input) Suggestion {
	if in.Attempts < MinAttempts {
		return Suggestion{Note: fmt.Sprintf("not enough data: %d finished attempt(s) in the window, at least %d are needed", in.Attempts, MinAttempts)}
	}
	s := Suggestion{Enough: true}
	s.MaxRuntime = CeilMinute(max(CeilMinute(time.Duration(runtimeHeadroom*float64(in.RuntimeP99))), in.RuntimeP99+in.HeartbeatInterval))
	s.StallTimeout = max(CeilMinute(gapHeadroom*in.GapP99), in.MinStallTimeout)
	sets := []string{"max_runtime = " + Interval(s.MaxRuntime), "stall_timeout = " + Interval(s.StallTimeout)}
	if in.HardTimeout <= s.MaxRuntime+s.StallTimeout {
		s.HardTimeout = CeilMinute(s.MaxRuntime + 2*s.StallTimeout)
		sets = append(sets, "hard_timeout = "+Interval(s.HardTimeout))
		s.Note = fmt.Sprintf("hard_timeout %s would not exceed max_runtime + stall_timeout (%s), so the type would be skipped as bad_limits: "+
			"hard_timeout %s is suggested with them; it applies to newly enqueued tasks only (asynq keeps each task's Timeout)",
			in.HardTimeout, s.MaxRuntime+s.StallTimeout, s.HardTimeout)
	}
	s.SQL = fmt.Sprintf("UPDATE %s SET %s WHERE name = %s;", in.Table, strings.Join(sets, ", "), quote(in.Type))
	return s
}

// CeilMinute rounds d up to a whole minute; a negative d is zero.
func CeilMinute(d time.Duration) time.Duration {
	if d <= 0 {
		return 0
	}
	return ((d + time.Minute - 1) / time.Minute) * time.Minute
}

// Interval writes d as a PostgreSQL interval literal: whole minutes as
// minutes, anything else in seconds (microseconds kept).
func Interval(d time.Duration) string {
	if d%time.Minute == 0 {
		return fmt.Sprintf("interval '%d minutes'", d/time.Minute)
	}
	return fmt.Sprintf("interval '%s seconds'", strings.TrimRight(strings.TrimRight(fmt.Sprintf("%.6f", d.Seconds()), "0"), "."))
}

// quote makes s a PostgreSQL string literal.
func quote(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// Report is suggest-limits' JSON document (--output json), and the table
// of the status page.
type Report struct {
	// WindowSeconds is the window the events were read from.
	WindowSeconds float64      `json:"window_seconds"`
	Types         []TypeReport `json:"types"`
}

// Quantiles are seconds; null where the window holds no value.
type Quantiles struct {
	P50 *float64 `json:"p50"`
	P95 *float64 `json:"p95,omitempty"`
	P99 *float64 `json:"p99,omitempty"`
	Max *float64 `json:"max"`
}

// TypeReport is one job type's line of a Report. Durations are seconds.
type TypeReport struct {
	Type string `json:"type"`
	// Attempts counts the finished attempts of the window (completed, or
	// failed by their handler); Reaps the reaps, ReapedWhileAlive those
	// whose worker's Complete or Advance came back after the reap.
	Attempts         int `json:"attempts"`
	Reaps            int `json:"reaps"`
	ReapedWhileAlive int `json:"reaped_while_alive"`
	// RuntimeSeconds has p50, p95, p99 and max; MaxIdleGapSeconds p50,
	// p99 and max; ReapDelaySeconds p50 and max.
	RuntimeSeconds    Quantiles `json:"runtime_seconds"`
	MaxIdleGapSeconds Quantiles `json:"max_idle_gap_seconds"`
	ReapDelaySeconds  Quantiles `json:"reap_delay_seconds"`
	// The type's limits as the daemon applies them.
	MaxRuntimeSeconds   float64 `json:"max_runtime_seconds"`
	StallTimeoutSeconds float64 `json:"stall_timeout_seconds"`
	HardTimeoutSeconds  float64 `json:"hard_timeout_seconds"`
	// The suggestion; null with not enough data.
	SuggestedMaxRuntimeSeconds   *float64 `json:"suggested_max_runtime_seconds"`
	SuggestedStallTimeoutSeconds *float64 `json:"suggested_stall_timeout_seconds"`
	SuggestedHardTimeoutSeconds  *float64 `json:"suggested_hard_timeout_seconds"`
	SQL                          string   `json:"sql"`
	Note                         string   `json:"note"`
}

// Apply fills r's suggestion from s.
func (r *TypeReport) Apply(s Suggestion) {
	r.SQL, r.Note = s.SQL, s.Note
	if !s.Enough {
		return
	}
	sec := func(d time.Duration) *float64 { v := d.Seconds(); return &v }
	r.SuggestedMaxRuntimeSeconds, r.SuggestedStallTimeoutSeconds = sec(s.MaxRuntime), sec(s.StallTimeout)
	if s.HardTimeout > 0 {
		r.SuggestedHardTimeoutSeconds = sec(s.HardTimeout)
	}
}
