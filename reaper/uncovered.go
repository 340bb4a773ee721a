package reaper

import (
	"context"
	"encoding/json"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"

	"github.com/jobreaper/jobreaper/internal/idcheck"
	"github.com/jobreaper/jobreaper/internal/pgstore"
)

// The uncovered-queue check. Each daemon scans its own queue set, and a
// queue that no daemon's set names is never scanned: its stalled jobs stay
// PROCESSING with nothing said. So one daemon, the leader whose queue set's
// leader lease key sorts first among the live leader leases, compares at
// each of its passes the queues asynq knows with the union of the live
// leases' queue sets, and reports the queues that no set covers and that
// hold stalled PROCESSING jobs: a warning when what it finds changes,
// jobreaper_uncovered_processing_jobs{queue} and Result.UncoveredQueues.
// run --once, which holds no leader lease, makes the check too, counting
// its own queues as covered. A daemon without a leader lease
// (--leader-lease=false) writes no lease, so it is not counted as
// covering anything, and makes no check.

// UncoveredStore is what the uncovered-queue check reads from PostgreSQL;
// *pgstore.Store satisfies it.
type UncoveredStore interface {
	ListLeaderLeases(ctx context.Context) (pgstore.LeaderLeases, error)
	CountStalledByQueue(ctx context.Context, queues []string, rule pgstore.StallRule) (map[string]int, error)
}

// everyQueueKey is the leader lease key of the set of every queue.
var everyQueueKey = pgstore.LeaderLeaseKey(nil)

// liveKeys returns the keys of the leases of ls that are live on the
// database clock of their read (ExpiresAt after ls.Now), sorted in byte
// order (PostgreSQL's COLLATE "C").
func liveKeys(ls pgstore.LeaderLeases) []string {
	var keys []string
	for _, row := range ls.Rows {
		if row.ExpiresAt.After(ls.Now) {
			keys = append(keys, row.Key)
		}
	}
	slices.Sort(keys)
	return keys
}

// checksUncovered reports whether the replica holding the leader lease key
// as holderID makes the uncovered-queue check: key is the first, in byte
// order, of the live leases of ls, and holderID holds it.
func checksUncovered(ls pgstore.LeaderLeases, key, holderID string) bool {
	keys := liveKeys(ls)
	if len(keys) == 0 || keys[0] != key {
		return false
	}
	for _, row := range ls.Rows {
		if row.Key == key {
			return row.HolderID == holderID
		}
	}
	return false
}

// covered returns the queues the live leases of ls and the keys of own
// cover together, or all = true when one of them is every queue ("[]").
// A key that is not a JSON array of strings (not one jobreaper writes)
// covers nothing.
func covered(ls pgstore.LeaderLeases, own []string) (set map[string]bool, all bool) {
	set = map[string]bool{}
	for _, key := range append(liveKeys(ls), own...) {
		var queues []string
		if err := json.Unmarshal([]byte(key), &queues); err != nil || queues == nil {
			continue
		}
		if len(queues) == 0 {
			return nil, true
		}
		for _, q := range queues {
			set[q] = true
		}
	}
	return set, false
}

// uncoveredQueues returns, sorted and each once, the queues of known that
// neither a live leader lease of ls (ExpiresAt after ls.Now, the database
// clock) nor a key of own covers. Keys are leader lease keys
// (pgstore.LeaderLeaseKey: the JSON array of a queue set); "[]" covers every
// queue. own are the keys of this run's own queues (run --once), counted
// as live. Names idcheck.CheckName refuses are left out: no statement nor
// metric label can carry them (the pass warns about them).
func uncoveredQueues(known []string, ls pgstore.LeaderLeases, own []string) []string {
	set, all := covered(ls, own)
	if all {
		return nil
	}
	var out []string
	for _, q := range known {
		if !set[q] && idcheck.CheckName("queue name", q) == nil {
			out = append(out, q)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// uncoveredState carries what the last check reported, so that the log
// says it once per change.
type uncoveredState struct {
	mu sync.Mutex
	// reported is the last check's finding: queue -> stalled jobs; empty
	// when it found none or this replica makes no check.
	reported map[string]int
}

// checkUncovered runs the uncovered-queue check of one pass: at most one
// read of the leader leases, one of asynq's queue list when known is nil
// (the pass did not read it) and one count of stalled rows, only when a
// queue is uncovered. A daemon makes it when its leader lease key sorts
// first among the live ones; run --once (Options.Once without a leader
// lease) always, with its own queues covered. A set of every queue covers
// all: such a daemon or run --once reads nothing. A read that fails is an
// error of the pass, and what was reported stays until the next check.
func (r *Reaper) checkUncovered(ctx context.Context, known []string, res *Result) {
	res.UncoveredQueues = map[string]int{}
	if ctx.Err() != nil {
		return
	}
	var own []string
	lease := r.opts.LeaderLease
	switch {
	case lease != nil && lease.Key() == everyQueueKey:
		return
	case lease != nil:
	case r.opts.Once:
		if own = []string{pgstore.LeaderLeaseKey(r.opts.Queues)}; own[0] == everyQueueKey {
			return
		}
	default:
		return // a daemon without a leader lease is no part of the check
	}
	leases, err := r.store.ListLeaderLeases(ctx)
	if err != nil {
		r.failed(ctx, res, stageLoad, "reading the leader leases for the uncovered-queue check failed; checked again next pass", "err", err)
		return
	}
	if lease != nil && !checksUncovered(leases, lease.Key(), lease.Holder().ID) {
		r.forgetUncovered()
		return
	}
	counts := map[string]int{}
	if _, all := covered(leases, own); !all {
		if known == nil {
			if known, err = r.lister.Queues(ctx); err != nil {
				r.failed(ctx, res, stageQueues, "listing asynq's queues for the uncovered-queue check failed; checked again next pass", "err", err)
				return
			}
		}
		if queues := uncoveredQueues(known, leases, own); len(queues) > 0 {
			if counts, err = r.store.CountStalledByQueue(ctx, queues, res.rule); err != nil {
				r.failed(ctx, res, stageLoad, "counting the stalled jobs of uncovered queues failed; checked again next pass",
					"queues", len(queues), "err", err)
				return
			}
		}
	}
	res.UncoveredQueues = maps.Clone(counts)
	r.reportUncovered(counts, liveKeys(leases))
}

// reportUncovered publishes a check's counts (queue -> stalled jobs):
// jobreaper_uncovered_processing_jobs, and a log line when they differ
// from the last check's: a warning naming each queue and its count, or,
// when none is left, that none is. live are the live leader lease keys.
func (r *Reaper) reportUncovered(counts map[string]int, live []string) {
	st := &r.uncovered
	st.mu.Lock()
	defer st.mu.Unlock()
	r.opts.Metrics.uncoveredCounts(counts)
	prev := st.reported
	st.reported = counts
	if maps.Equal(prev, counts) {
		return
	}
	sets := strings.Join(live, " ")
	if len(counts) == 0 {
		r.log.Info("uncovered queues: none left; every queue asynq knows that holds stalled PROCESSING jobs is in a live leader lease's queue set",
			"queue_sets", sets)
		return
	}
	total := 0
	attrs := make([]slog.Attr, 0, len(counts))
	for _, q := range slices.Sorted(maps.Keys(counts)) {
		total += counts[q]
		attrs = append(attrs, slog.Int(q, counts[q]))
	}
	r.log.Warn("uncovered queues: stalled PROCESSING jobs in queues asynq knows that no live leader lease's queue set covers, "+
		"so no daemon scans them; add each queue to a daemon's --queues, or run a daemon of every queue",
		"queues", len(counts), "jobs", total, slog.Attr{Key: "uncovered", Value: slog.GroupValue(attrs...)}, "queue_sets", sets)
}

// forgetUncovered drops what this replica reported when it stops making
// the check (another leader's queue set sorts first now, or it lost its
// leader lease): its gauge goes to 0, the other leader reports.
func (r *Reaper) forgetUncovered() {
	st := &r.uncovered
	st.mu.Lock()
	defer st.mu.Unlock()
	if len(st.reported) == 0 {
		return
	}
	st.reported = nil
	r.opts.Metrics.uncoveredCounts(nil)
	r.log.Info("uncovered queues: this replica no longer makes the check (another leader's queue set sorts first, " +
		"or this one lost its leader lease); its jobreaper_uncovered_processing_jobs series are 0")
}
