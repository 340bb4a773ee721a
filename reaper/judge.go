package reaper

import (
	"cmp"
	"slices"
	"strings"
	"time"

	"github.com/jobreaper/jobreaper/internal/asynqstate"
	"github.com/jobreaper/jobreaper/internal/pgcore"
	"github.com/jobreaper/jobreaper/internal/pgstore"
	"github.com/jobreaper/jobreaper/jobs"
)

// jobKind is what many stalled jobs of one pass share: their type, queue
// (the row's, "" when NULL) and stall timeout, kept once per pass (kinds)
// instead of once per job.
type jobKind struct {
	typ, queue string
	stall      time.Duration
}

// heldQueue is the queue a hold names for jobs of this kind (queueOf).
func (k *jobKind) heldQueue() string { return cmp.Or(k.queue, pgstore.QueueDefault) }

// kinds interns a pass's jobKinds.
type kinds map[jobKind]*jobKind

func (k kinds) of(typ, queue string, stall time.Duration) *jobKind {
	key := jobKind{typ, queue, stall}
	if p, ok := k[key]; ok {
		return p
	}
	p := &key
	k[key] = p
	return p
}

// stalledJob is what a pass keeps of a stalled job between its judging
// and its reap: what the reap's compare-and-set repeats (ID, generation,
// updated_at), what the stall-storm hold needs (kind) and whether the reap
// is a retry (plan). It is 48 bytes: a pass that finds 100,000 active jobs
// stalled keeps 5 MB of them, the ID strings shared with the pass's ID
// list.
type stalledJob struct {
	id         string
	generation int64
	// updatedUs is updated_at in Unix microseconds, all the database
	// keeps of it.
	updatedUs int64
	kind      *jobKind
	// plan is DecideRetry's answer for the job's reap.
	plan RetryPlan
}

// updatedAt returns the job's updated_at as read.
func (s stalledJob) updatedAt() time.Time { return time.UnixMicro(s.updatedUs) }

// queueOf is the queue a row's job runs in, as holds name it: its queue
// column, or asynq's default queue when NULL (where queue.Enqueue puts
// such a job's task).
func queueOf(snap *jobs.Snapshot) string {
	return cmp.Or(snap.Queue, pgstore.QueueDefault)
}

// keep returns what the pass keeps of snap, stalled with verdict v (its
// task active).
func (k kinds) keep(snap *jobs.Snapshot, v Verdict) stalledJob {
	return stalledJob{id: snap.ID, generation: snap.Generation, updatedUs: snap.UpdatedAt.UnixMicro(),
		kind: k.of(snap.Type, snap.Queue, v.StallTimeout),
		plan: DecideRetry(pgcore.BudgetOf(*snap), jobs.ReasonStalled, asynqstate.TaskActive)}
}

// keepAll returns what a reap needs of snaps (lost tasks, whose tasks
// asynq holds as tasks says), sorted by ID.
func keepAll(snaps []jobs.Snapshot, tasks map[string]asynqstate.TaskStatus) []stalledJob {
	k := kinds{}
	out := make([]stalledJob, len(snaps))
	for i := range snaps {
		out[i] = stalledJob{id: snaps[i].ID, generation: snaps[i].Generation, updatedUs: snaps[i].UpdatedAt.UnixMicro(),
			kind: k.of(snaps[i].Type, snaps[i].Queue, 0),
			plan: DecideRetry(pgcore.BudgetOf(snaps[i]), jobs.ReasonLostTask, tasks[snaps[i].ID])}
	}
	sortStalled(out)
	return out
}

func sortStalled(s []stalledJob) {
	slices.SortFunc(s, func(a, b stalledJob) int { return strings.Compare(a.id, b.id) })
}

// judgement is what a pass gathers while it judges its active tasks
// batch by batch: the stalled jobs, and how many tasks it judged per
// queue (the share the stall-storm check compares with).
type judgement struct {
	stalled []stalledJob
	kinds   kinds
	// judged counts the tasks Decide judged, by the queue of their row
	// (queueOf), "" for tasks without a row.
	judged map[string]int
	// stalling counts the jobs about to stall (stallingSoon), by kind: the
	// stall-storm check counts them with the stalled ones.
	stalling map[*jobKind]int
	// loadFailed: a batch of rows could not be loaded, so some tasks were
	// not judged this pass.
	loadFailed bool
}

func newJudgement() *judgement {
	return &judgement{kinds: kinds{}, judged: map[string]int{}, stalling: map[*jobKind]int{}}
}

// stallingSoon reports whether a job Decide judged with v did not reap
// because it is not stalled yet (progressing, or held by the outage grace)
// but has been idle, counted as the rule counts it (from the later of
// updated_at and rule.OutageEnd), for at least its stall timeout minus
// heartbeat: one heartbeat interval from stalling. Workers that lose
// PostgreSQL at once wrote their last heartbeats at most one heartbeat
// interval apart, so when the first of them is stalled the others are
// stalling soon (StormCheck counts them together). heartbeat <= 0 (not
// known) reports false.
func stallingSoon(snap *jobs.Snapshot, v Verdict, now time.Time, rule pgstore.StallRule, heartbeat time.Duration) bool {
	if heartbeat <= 0 || snap == nil || (v.Skip != SkipProgressing && v.Skip != SkipOutageGrace) {
		return false
	}
	idle := v.Idle
	if !rule.OutageEnd.IsZero() && rule.OutageEnd.After(snap.UpdatedAt) {
		idle = now.Sub(rule.OutageEnd)
	}
	return idle >= v.StallTimeout-heartbeat
}

// heartbeatInterval is the workers' heartbeat interval the rule implies:
// its MinStallTimeout is 2 x heartbeat interval + interval (config's
// MinStallTimeout), so the heartbeat interval is (MinStallTimeout -
// interval) / 2; 0 when that is not positive.
func heartbeatInterval(rule pgstore.StallRule, interval time.Duration) time.Duration {
	return max((rule.MinStallTimeout-interval)/2, 0)
}
