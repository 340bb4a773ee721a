package reaper

import "fmt"

// SkipStallStormHeld: a stalled job of a queue a stall-storm hold holds
// (reaper_holds): the pass that started the hold judged that too many
// active jobs had gone idle at once to be real stalls (workers cut off
// from PostgreSQL look exactly like that), so none is reaped until the
// hold ends or an operator releases it (jobreaper release-hold). Jobs that
// start stalling during the hold are held with the rest; those that make
// progress meanwhile are never reaped.
const SkipStallStormHeld SkipReason = "stall_storm_held"

// StormMinStalled is the fewest stalled jobs the fraction limit
// (StormLimits.MaxFraction) holds: below it, a fraction of a small fleet
// is noise (3 of 4 jobs stalled on a quiet queue is no storm), and
// holding them would only delay real reaps.
const StormMinStalled = 10

// StormLimits are the stall-storm thresholds of a pass: settings
// max_stalled_per_pass and max_stalled_fraction.
type StormLimits struct {
	// MaxStalled is the most jobs one pass may reap as stalled; a pass
	// that would reap more reaps none. 0: no limit.
	MaxStalled int
	// MaxFraction is the largest share of the active tasks a pass judged
	// that it may reap as stalled, once they are StormMinStalled or more;
	// a pass that would reap more reaps none. 0: no limit; at most 1.
	MaxFraction float64
}

// Limits that trip a stall storm (Storm.Limit).
const (
	LimitMaxStalled  = "max_stalled_per_pass"
	LimitMaxFraction = "max_stalled_fraction"
)

// Storm is StormCheck's answer.
type Storm struct {
	// Hold is true when the pass must reap none of its stalled jobs and
	// hold their queues.
	Hold bool
	// Limit names the limit that tripped (LimitMaxStalled first, then
	// LimitMaxFraction); "" when Hold is false.
	Limit string
	// Why says the same with the counts and the limit's value, for the
	// warning and the hold's row; "" when Hold is false.
	Why string
}

// StormCheck is the stall-storm rule, with no I/O: a pass that would reap
// stalled jobs as stalled (at least one), having judged judged active
// tasks of which stalling more are one heartbeat interval or less from
// their stall timeout (they stall in the next passes unless they make
// progress), holds them all when n = stalled + stalling is more than
// l.MaxStalled (a set limit), or when n >= StormMinStalled and n >
// l.MaxFraction x judged (a set limit). Exactly l.MaxStalled jobs, or
// exactly the fraction, is not a storm.
//
// The jobs stalling soon count because workers that lose PostgreSQL at
// once wrote their last heartbeats up to one heartbeat interval apart:
// they cross the stall timeout over several passes, each of which alone
// may see too few to call it a storm, and the first ones would be reaped.
// When the first of them is stalled, every other one is within one
// heartbeat interval of its stall timeout: one pass sees them all. Jobs
// that hang one after another (a trickle) are rarely that close together.
//
// judged counts the active tasks the jobs are among, so it is at least n;
// a smaller judged is taken as n. The share is compared as n / judged,
// the double nearest the true ratio, so a ratio equal to the fraction as
// written (10 of 100 at 0.1) is not more than it.
func StormCheck(stalled, stalling, judged int, l StormLimits) Storm {
	n := stalled + max(stalling, 0)
	judged = max(judged, n)
	switch {
	case stalled <= 0:
		return Storm{}
	case l.MaxStalled > 0 && n > l.MaxStalled:
		return Storm{Hold: true, Limit: LimitMaxStalled,
			Why: fmt.Sprintf("%s in one pass, more than max_stalled_per_pass %d", stormJobs(stalled, stalling), l.MaxStalled)}
	case l.MaxFraction > 0 && n >= StormMinStalled && float64(n)/float64(judged) > l.MaxFraction:
		return Storm{Hold: true, Limit: LimitMaxFraction,
			Why: fmt.Sprintf("%s of %d active tasks judged, more than max_stalled_fraction %g of them (and at least %d)",
				stormJobs(stalled, stalling), judged, l.MaxFraction, StormMinStalled)}
	}
	return Storm{}
}

// stormJobs names the jobs a storm counts: "12 stalled jobs", or "4
// stalled jobs and 8 stalling soon".
func stormJobs(stalled, stalling int) string {
	if stalling > 0 {
		return fmt.Sprintf("%d stalled jobs and %d stalling soon", stalled, stalling)
	}
	return fmt.Sprintf("%d stalled jobs", stalled)
}
