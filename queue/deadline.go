package queue

import (
	"context"
	"log/slog"
	"time"

	"github.com/jobreaper/jobreaper/jobs"
)

// guardStallTimeoutDefault is the stall timeout the guard assumes for
// types without their own when WithStallTimeout is not given: the daemon's
// default, config.StallTimeoutDefault (15 minutes; this package cannot
// import config, and a test holds the two equal).
const guardStallTimeoutDefault = 15 * time.Minute

// WithStallTimeout gives the guard the daemon's stall timeout (the
// stall_timeout setting, in the daemon's configuration), which applies to
// job types whose job_types row leaves stall_timeout NULL. The guard uses it
// for one thing: the short-deadline warning at each claim (see
// Middleware). Without this option, or with d zero or negative, it assumes
// the daemon's default, 15 minutes. Pass the same value the daemon runs
// with (config.Config.StallTimeout in a worker that loads the daemon's
// settings).
func WithStallTimeout(d time.Duration) GuardOption {
	return func(g *Guard) {
		if d > 0 {
			g.stallTimeout = d
		}
	}
}

// checkDeadline warns when the handler of lease's attempt must end before
// the reaper could ever judge the attempt stalled: asynq puts the task's
// deadline (the earlier of its Timeout and Deadline) into the handler's
// context, and asynq cancels the handler at that time, whatever its
// progress, then retries or archives the task. The rule the reaper applies
// needs started_at + max_runtime + stall timeout (the type's own, else the
// guard's, see WithStallTimeout). asynq's deadline is a reading of this
// host's clock, so it is compared with this host's clock at the claim,
// which started_at (the database's) matches to within the claim's round
// trip. A type without a job_types row, or a context without a deadline, is
// not checked.
//
// Every such claim counts in jobreaper_guard_short_deadline_total{type}; the
// first one of each type logs one WARN for the life of the Guard (a worker
// process has one), naming the type, the deadline, max_runtime and the
// stall timeout. The task runs as before.
func (g *Guard) checkDeadline(ctx context.Context, log *slog.Logger, lease jobs.Lease) {
	deadline, ok := ctx.Deadline()
	if !ok || lease.MaxRuntime <= 0 {
		return
	}
	stall, from := lease.StallTimeout, "job_types"
	if stall <= 0 {
		stall, from = g.stallTimeout, "guard"
	}
	needed := jobs.MaxDuration // max_runtime + stall, saturated
	if lease.MaxRuntime <= jobs.MaxDuration-stall {
		needed = lease.MaxRuntime + stall
	}
	left := deadline.Sub(g.now())
	if left >= needed {
		return
	}
	g.countShortDeadline(lease.Type)
	if _, warned := g.warnedTypes.LoadOrStore(lease.Type, true); warned {
		return
	}
	fix := "enqueue through queue.Enqueue (it passes the type's hard_timeout) or give the task a Timeout and Deadline above max_runtime + stall timeout"
	if from == "guard" {
		// The stall timeout is the guard's default (15 minutes unless
		// queue.WithStallTimeout gave the daemon's): often the cause when
		// the daemon runs a shorter one.
		fix = "give the guard the daemon's stall_timeout (queue.WithStallTimeout) if it differs from the one used here, " +
			"or raise the type's hard_timeout (queue.Enqueue passes it as the task's Timeout) above max_runtime + stall timeout"
	}
	log.WarnContext(ctx, "task's deadline ends before the reaper could judge its attempt stalled: asynq cancels the handler at the deadline "+
		"whatever its progress; "+fix+" (warned once per type)",
		"reason", "short_deadline", "type", lease.Type, "max_runtime", lease.MaxRuntime, "stall_timeout", stall,
		"stall_timeout_from", from, "deadline", deadline, "time_left", left.Round(time.Millisecond), "lease_generation", lease.Generation)
}
