package reaper

import (
	"errors"
	"fmt"

	"github.com/jobreaper/jobreaper/internal/pgstore"
	"github.com/jobreaper/jobreaper/jobs"
)

// Result is what one pass did. Its JSON form is the output of
// `jobreaper run --once --output json`.
type Result struct {
	// Scanned counts the active tasks listed, including entries without a
	// task ID or without a lease.
	Scanned int `json:"scanned"`
	// Reaped counts jobs this pass failed.
	Reaped int `json:"reaped"`
	// Skipped counts, by SkipReason, the scanned tasks left alone and the
	// rows the lost-task search left alone (awaiting_retry, lost_held,
	// no_queue, bad_row); ScannedBy accounts for the scanned tasks alone.
	Skipped map[string]int `json:"skipped"`
	// Errors counts failures inside the pass: a queue that could not be
	// listed, a batch that could not be loaded, a reap or a marker write
	// that failed. Each is tried again next pass.
	Errors int `json:"errors"`
	// ReapedBy counts reaped jobs by failure reason: stalled, lost_task.
	ReapedBy map[string]int `json:"reaped_by"`
	// RetriedBy counts, by reason (stalled, lost_task), the reaps that
	// were retries (the job put back to QUEUED to run again); each is
	// counted in Reaped and ReapedBy too.
	RetriedBy map[string]int `json:"retried_by"`
	// RetriesFinished counts what the pass did to retry-reaped jobs asynq
	// had stranded: reenqueued, cancel_resent, failed_impossible.
	RetriesFinished map[string]int `json:"retries_finished"`
	// LostLimitTripped is true when the cycle over the lost-task
	// candidates that ended this pass would have reaped more than
	// MaxLostPerPass jobs, so it reaped none.
	LostLimitTripped bool `json:"lost_limit_tripped"`
	// StallStormHeld counts the stalled jobs this pass did not reap
	// because a stall-storm hold holds their queues (skip reason
	// stall_storm_held), the hold this pass started included.
	StallStormHeld int `json:"stall_storm_held"`
	// StallStormHolds are the stall-storm holds in effect for this pass's
	// queues, in queue order, each with the jobs it held this pass; one
	// this pass started has Started set (a dry run: the hold it would
	// start, with ID 0). run --once exits 1 while one is in effect.
	StallStormHolds []HoldReport `json:"stall_storm_holds"`
	// StaleQueued counts QUEUED jobs older than StaleQueuedAfter whose
	// task asynq will never run, among those this pass looked up.
	StaleQueued int `json:"stale_queued"`
	// BrokenActive counts entries of the active lists listed this pass
	// whose task hash is gone or that have no lease (broken: asynq never
	// runs nor recovers them; jobreaper never writes to them).
	BrokenActive int `json:"broken_active"`
	// MarkersRestored counts markers this pass wrote again: their write at
	// the reap had failed, or they were lost since (failover, eviction).
	MarkersRestored int `json:"markers_restored"`
	// Interrupted is true when the pass was stopped before its end (its
	// context cancelled: SIGTERM, Ctrl-C, Stop): what it did is counted,
	// but it did not look at everything, and errors met after the stop
	// are not counted.
	Interrupted bool `json:"interrupted"`
	// Panicked is true when the pass panicked: the panic was recovered and
	// logged once with its stack, and the pass ended there. Its other
	// counts are lost with it (each reap it made was logged as it was
	// made); the next pass starts afresh.
	Panicked bool `json:"panicked"`
	// QueuesNotFound names the queues of the pass that asynq has never
	// seen (not in asynq:queues), sorted: treated as empty, each one
	// likely a typo in the queue list or a wrong Redis database.
	QueuesNotFound []string `json:"queues_not_found"`
	// ScannedBy puts every scanned active task in exactly one reason:
	// stalled (reaped as stalled; in a dry run, would be), the skip reason
	// Decide or the pass gave it (no_row, not_processing, bad_row,
	// no_start_time, unknown_type, bad_limits, within_limit, progressing,
	// no_job_id, bad_job_id, changed_since_read, stall_storm_held), or one
	// of the Scanned*
	// reasons, which name the outcomes no skip reason does. On every pass
	// that is not interrupted it adds up to Scanned (CheckScanned). The
	// lost-task search's outcomes (lost_task, awaiting_retry, lost_held,
	// no_queue) are not in it: they are about rows, not scanned tasks,
	// and a no_lease task reaped as lost_task counts in both.
	ScannedBy map[string]int `json:"scanned_by"`
	// BadQueueNames counts the queue names of the pass that
	// idcheck.CheckName refused (a NUL byte, invalid UTF-8, over
	// jobs.MaxIDLength bytes): skipped for the pass.
	BadQueueNames int `json:"bad_queue_names"`
	// MarkersHeld counts the markers this pass did not write because no
	// live asynq server serves any queue of the pass in the Redis it reads
	// (a wrong database or address looks the same): those that marker
	// repair or re-assertion found missing. run --once exits 1 when it is
	// above 0.
	MarkersHeld int `json:"markers_held"`
	// QueueSuggestions gives, for each of QueuesNotFound that is close
	// enough to a queue asynq knows in that Redis to be a typo, that
	// queue (Options.Suggest).
	QueueSuggestions map[string]string `json:"queues_did_you_mean"`
	// UncoveredQueues counts, for each queue asynq knows that no live
	// leader lease's queue set covers (nor, in run --once, the queues of
	// the run), its PROCESSING jobs stalled by the stall rule: no daemon
	// scans them. Only queues with such jobs are named; empty when none,
	// or when this pass made no uncovered-queue check (a daemon whose
	// queue set does not sort first among the live leader leases, or
	// that runs without one).
	UncoveredQueues map[string]int `json:"uncovered_queues"`
	// AtRisk counts the active jobs this pass left PROCESSING past their
	// type's max_runtime with an idle time of at least half their stall
	// timeout (AtRisk): stall_storm_held jobs included, the lost-task
	// search's rows not.
	AtRisk int `json:"at_risk"`
	// Decisions are a dry run's decisions, one per job looked at; nil in a
	// real pass.
	Decisions []Decision `json:"-"`
	// atRiskSeries counts AtRisk by type and queue, for
	// jobreaper_jobs_at_risk.
	atRiskSeries map[kindSeries]int
	// reapDelays are the reaps' jobreaper_reap_delay_seconds
	// observations.
	reapDelays []delaySample
	// reapedSeries counts reaped jobs by reason, type and queue, for
	// jobreaper_jobs_reaped_total.
	reapedSeries map[reapSeries]int
	// retriedSeries counts retry reaps likewise, for
	// jobreaper_jobs_retried_after_reap_total.
	retriedSeries map[reapSeries]int
	// rule is the stall rule the pass judges by: Options.Rule with the
	// outage end of the pass's clock reading.
	rule pgstore.StallRule
	// decided indexes Decisions by job ID.
	decided map[string]int
	// notes are the jobs at risk and the candidates of the pass, for its
	// pass record (Options.PassRecord).
	notes passNotes
}

// reapSeries labels one series of jobreaper_jobs_reaped_total.
type reapSeries struct{ reason, typ, queue string }

func newResult() Result {
	return Result{Skipped: map[string]int{}, ReapedBy: map[string]int{jobs.ReasonStalled: 0, jobs.ReasonLostTask: 0},
		RetriedBy:       map[string]int{jobs.ReasonStalled: 0, jobs.ReasonLostTask: 0},
		RetriesFinished: map[string]int{RetryReenqueued: 0, RetryCancelResent: 0, RetryFailedImpossible: 0},
		ScannedBy:       map[string]int{}, reapedSeries: map[reapSeries]int{}, retriedSeries: map[reapSeries]int{}}
}

func (r *Result) skip(reason SkipReason, n int) {
	if n > 0 {
		r.Skipped[string(reason)] += n
	}
}

// Reasons of Result.ScannedBy for the outcomes of a scanned active task
// that no skip reason names.
const (
	// ScannedNoLease: an active entry without a lease (asynq never runs
	// nor recovers it); its job is judged by the lost-task search, and
	// counted there too when it is reaped as lost_task.
	ScannedNoLease = "no_lease"
	// ScannedDuplicate: a task ID listed again (in two queues, or twice in
	// a list that moved while it was read): judged once, at its first
	// listing.
	ScannedDuplicate = "duplicate"
	// ScannedLoadFailed: a task of a load batch whose rows could not be
	// read (an error of the pass; the next pass judges it).
	ScannedLoadFailed = "load_failed"
	// ScannedReapFailed: a stalled job whose reap did not commit (its
	// batch failed, or its on_failed cascade did; an error of the pass).
	ScannedReapFailed = "reap_failed"
	// ScannedLeaseLapsed: a stalled job not reaped because the daemon's
	// leader lease lapsed during the pass (the new leader reaps it).
	ScannedLeaseLapsed = "lease_lapsed"
	// ScannedHoldsUnread: a stalled job not reaped because the stall-storm
	// holds of the pass's queues could not be read (an error of the pass;
	// the next pass judges it again).
	ScannedHoldsUnread = "holds_unread"
)

// scannedAs counts n scanned active tasks under reason (ScannedBy).
func (r *Result) scannedAs(reason string, n int) {
	if n > 0 {
		r.ScannedBy[reason] += n
	}
}

// ErrScannedMismatch is wrapped by CheckScanned's error.
var ErrScannedMismatch = errors.New("scanned tasks do not add up")

// ScannedMismatchLog is the message of the ERROR line a pass logs when
// CheckScanned fails, for tests and log searches.
const ScannedMismatchLog = "pass summary does not add up: scanned differs from the sum of scanned_by"

// CheckScanned returns nil when every scanned active task is counted in
// exactly one ScannedBy reason (Scanned equals their sum), or when the
// pass was interrupted (it stopped counting midway). Otherwise it returns
// an error wrapping ErrScannedMismatch that gives both numbers and the
// reasons.
func (r Result) CheckScanned() error {
	if r.Interrupted {
		return nil
	}
	sum := 0
	for _, n := range r.ScannedBy {
		sum += n
	}
	if sum != r.Scanned {
		return fmt.Errorf("%w: scanned %d active task(s), scanned_by sums to %d (%v)", ErrScannedMismatch, r.Scanned, sum, r.ScannedBy)
	}
	return nil
}
