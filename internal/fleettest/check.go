package fleettest

import (
	"cmp"
	"fmt"
	"slices"
	"time"
)

// The job kinds of the fleet suite, as the checker knows them.
const (
	KindNormal   = "normal"   // completes at once
	KindRetried  = "retried"  // fails its first attempt with retries left, completes the next
	KindFailing  = "failing"  // fails with no retry left: FAILED by its handler
	KindStalling = "stalling" // heartbeats, then stops and hangs: must be reaped
	KindLate     = "late"     // as stalling, then completes after its reap: must be refused
	KindSlow     = "slow"     // heartbeats past max_runtime, then completes: must never be reaped
)

// hangs reports whether an attempt of kind stops heartbeating on purpose.
func hangs(kind string) bool { return kind == KindStalling || kind == KindLate }

// Transition is one row of the history: a change of a job's updated_at,
// generation or status, at the database time of the writing statement.
type Transition struct {
	At            time.Time
	JobID         string
	Generation    int64
	Status        string
	UpdatedAt     time.Time
	Worker        string
	FailureReason string
}

// ReapEvent is one reaped event of job_events.
type ReapEvent struct {
	JobID      string
	Generation int64
	// DBNow is the reap transaction's now(); HolderID the leader lease
	// holder of the daemon that reaped; Retry the event's "retry" (the
	// job was released for another attempt, and no marker is written).
	DBNow        time.Time
	HolderID     string
	Retry        bool
	UpdatedAt    time.Time
	StallTimeout time.Duration
	OutageEnd    time.Time
}

// LeaseVersion is one version of a leader lease row (HolderID empty: the
// row was deleted, a release).
type LeaseVersion struct {
	At        time.Time
	Key       string
	HolderID  string
	ExpiresAt time.Time
}

// Charge is one product row a completion wrote.
type Charge struct {
	JobID      string
	Generation int64
}

// Outage is a span during which the named processes (all when nil) could
// not write to PostgreSQL while alive: a relay cut, a restart. Idle time
// of their attempts counts from its End.
type Outage struct {
	Kind       string
	Start, End time.Time
	Processes  []string
}

func (o Outage) hits(process string) bool {
	return o.Processes == nil || slices.Contains(o.Processes, process)
}

// History is everything the checker judges: what the database recorded
// (Transitions, Reaps, Leases, Charges), what Redis held at the end
// (Markers), and what the test did and knows (Kinds, Killed, Outages,
// the bounds).
type History struct {
	Transitions []Transition
	Reaps       []ReapEvent
	Leases      []LeaseVersion
	Charges     []Charge
	// Markers holds the job IDs with a reap marker in Redis at the end.
	Markers map[string]bool
	// Kinds is each job's kind (Kind*).
	Kinds map[string]string
	// Killed is when each SIGKILLed worker process (by its worker name)
	// died: its attempts are counted apart.
	Killed map[string]time.Time
	// Outages are the spans in which processes could not write.
	Outages []Outage
	// StallBound is how long after its last heartbeat (or the end of an
	// outage after it) a stalling attempt must be reaped: its stall
	// timeout + 2 intervals + the takeover bound + any hold that applied.
	StallBound time.Duration
	// End is when the run stopped producing effects to judge: a stalling
	// attempt whose bound ends after it is not judged for its delay.
	End time.Time
}

// Verdict is what Check found.
type Verdict struct {
	// Violations lists every broken invariant, one line each.
	Violations []string
	// FalseReaps counts reaps of alive attempts (also in Violations).
	FalseReaps int
	// DoubleEffects counts jobs with a second terminal transition or
	// charge, or a charge without COMPLETED (also in Violations).
	DoubleEffects int
	// KilledReaps counts reaps of attempts whose process was killed.
	KilledReaps int
	// ReapDelays are, per kind, each reap's time after the attempt's last
	// heartbeat (or the end of an outage after it).
	ReapDelays map[string][]time.Duration
	// Reaps counts the reaped events judged.
	Reaps int
}

func terminal(status string) bool {
	return status == "COMPLETED" || status == "FAILED" || status == "CANCELLED"
}

type attemptKey struct {
	job string
	gen int64
}

// Check judges h against the fleet suite's invariants, per job and per
// generation:
//
//   - at most one terminal transition per job, and no change of the row
//     after it (a superseded attempt's write that landed), and no
//     generation going back;
//   - charges at most once per job, of the generation that COMPLETED;
//   - every reaped generation has one reaped event and, unless it has
//     retry: true, a marker;
//   - no false reap: an attempt of a kind that never hangs, whose process
//     was not killed, reaped less than its stall timeout after its last
//     heartbeat or after the end of an outage that hit its process (or
//     during one);
//   - one leader: at each reap, the lease history names its holder_id as
//     the holder of a lease not yet expired;
//   - every attempt of a hanging kind reaped within StallBound of its
//     last heartbeat (or outage end), unless its process was killed or the
//     bound ends after End.
//
// It is pure: the same History gives the same Verdict.
func Check(h History) Verdict {
	res := Verdict{ReapDelays: map[string][]time.Duration{}}
	bad := func(format string, args ...any) {
		res.Violations = append(res.Violations, fmt.Sprintf(format, args...))
	}

	byJob := map[string][]Transition{}
	for _, tr := range h.Transitions {
		byJob[tr.JobID] = append(byJob[tr.JobID], tr)
	}
	jobsSorted := make([]string, 0, len(byJob))
	for id := range byJob {
		jobsSorted = append(jobsSorted, id)
	}
	slices.Sort(jobsSorted)
	completedGen := map[string]int64{}
	for _, id := range jobsSorted {
		trs := byJob[id]
		terminals := 0
		var prev *Transition
		for i := range trs {
			tr := &trs[i]
			if prev != nil {
				if tr.Generation < prev.Generation {
					bad("%s: generation went back from %d to %d at %s", id, prev.Generation, tr.Generation, tr.At.Format(time.StampMilli))
				}
				if terminal(prev.Status) {
					bad("%s: a write landed after its terminal %s (generation %d): %s generation %d at %s", id, prev.Status,
						prev.Generation, tr.Status, tr.Generation, tr.At.Format(time.StampMilli))
				}
			}
			if terminal(tr.Status) && (prev == nil || !terminal(prev.Status)) {
				terminals++
				if tr.Status == "COMPLETED" {
					completedGen[id] = tr.Generation
				}
			}
			prev = tr
		}
		if terminals > 1 {
			res.DoubleEffects++
			bad("%s: %d terminal transitions, want at most 1", id, terminals)
		}
	}

	charges := map[string]int{}
	for _, c := range h.Charges {
		charges[c.JobID]++
		gen, ok := completedGen[c.JobID]
		if !ok || gen != c.Generation {
			res.DoubleEffects++
			bad("%s: a charge of generation %d without that generation COMPLETED", c.JobID, c.Generation)
		}
	}
	for _, id := range sortedKeys(charges) {
		if n := charges[id]; n > 1 {
			res.DoubleEffects++
			bad("%s: %d charges, want at most 1", id, n)
		}
	}

	// Reaps.
	events := map[attemptKey]int{}
	for _, r := range h.Reaps {
		events[attemptKey{r.JobID, r.Generation}]++
	}
	reaped := map[attemptKey]bool{}
	for _, r := range h.Reaps {
		k := attemptKey{r.JobID, r.Generation}
		if reaped[k] {
			continue
		}
		reaped[k] = true
		res.Reaps++
		if n := events[k]; n != 1 {
			bad("%s generation %d: %d reaped events, want 1", r.JobID, r.Generation, n)
		}
		if !r.Retry && !h.Markers[r.JobID] {
			bad("%s generation %d: reaped without retry, and no marker at the end", r.JobID, r.Generation)
		}
		at, last, process := reapTimes(byJob[r.JobID], r)
		if !holds(h.Leases, r.HolderID, at) {
			bad("%s generation %d: reaped at %s by holder %q, which the lease history does not name as the holder then",
				r.JobID, r.Generation, at.Format(time.StampMilli), r.HolderID)
		}
		if killedAt, ok := h.Killed[process]; ok && !killedAt.After(at) {
			res.KilledReaps++
			continue
		}
		from, inOutage := idleFrom(h.Outages, process, last, at)
		kind := h.Kinds[r.JobID]
		res.ReapDelays[kind] = append(res.ReapDelays[kind], at.Sub(from))
		if hangs(kind) && firstAttempt(byJob[r.JobID], r.Generation) {
			if d := at.Sub(from); d > h.StallBound {
				bad("%s generation %d (%s): reaped %s after its last heartbeat, over the bound %s", r.JobID, r.Generation, kind,
					d.Round(time.Millisecond), h.StallBound)
			}
			continue
		}
		if inOutage || at.Sub(from) < r.StallTimeout {
			res.FalseReaps++
			bad("false reap: %s generation %d (%s, %s alive) reaped at %s, %s after its last heartbeat or outage end (stall timeout %s, in an outage: %v)",
				r.JobID, r.Generation, kind, process, at.Format(time.StampMilli), at.Sub(from).Round(time.Millisecond), r.StallTimeout, inOutage)
		}
	}

	// Every hanging attempt reaped within its bound.
	for _, id := range jobsSorted {
		if !hangs(h.Kinds[id]) {
			continue
		}
		trs := byJob[id]
		gen, process, last, ok := firstClaim(trs)
		if !ok || reaped[attemptKey{id, gen}] {
			continue
		}
		if _, killed := h.Killed[process]; killed {
			continue
		}
		if terminalBy(trs, gen) {
			continue
		}
		from, _ := idleFrom(h.Outages, process, last, h.End)
		if from.Add(h.StallBound).Before(h.End) {
			bad("%s generation %d (%s): never reaped, its last heartbeat at %s, the bound %s over before the end at %s", id, gen,
				h.Kinds[id], from.Format(time.StampMilli), h.StallBound, h.End.Format(time.StampMilli))
		}
	}
	return res
}

// reapTimes returns when attempt r was reaped (the history's transition
// away from PROCESSING of its generation at or after its DBNow; DBNow when
// none is recorded), its last heartbeat before that (the last transition
// of the generation before it), and the worker that held it.
func reapTimes(trs []Transition, r ReapEvent) (at, last time.Time, process string) {
	at, last = r.DBNow, r.UpdatedAt
	for _, tr := range trs {
		if tr.Generation != r.Generation {
			continue
		}
		if tr.Status == "PROCESSING" && !tr.At.After(r.DBNow) {
			last, process = tr.At, tr.Worker
			continue
		}
		if tr.Status != "PROCESSING" && !tr.At.Before(r.DBNow) && at.Equal(r.DBNow) {
			at = tr.At
		}
	}
	return at, last, process
}

// idleFrom returns the latest of last and the end of every outage that
// hit process and ended by at, and whether at falls inside one.
func idleFrom(outages []Outage, process string, last, at time.Time) (time.Time, bool) {
	from, in := last, false
	for _, o := range outages {
		if !o.hits(process) || o.Start.After(at) {
			continue
		}
		if o.End.After(at) {
			in = true
			continue
		}
		if o.End.After(from) {
			from = o.End
		}
	}
	return from, in
}

// holds reports whether the lease history names holder as the holder of
// an unexpired lease at t (the last version written by t).
func holds(leases []LeaseVersion, holder string, t time.Time) bool {
	if holder == "" {
		return false
	}
	var cur *LeaseVersion
	for i := range leases {
		if leases[i].At.After(t) {
			break
		}
		cur = &leases[i]
	}
	return cur != nil && cur.HolderID == holder && cur.ExpiresAt.After(t)
}

// firstClaim returns the first PROCESSING generation of a job, its
// worker and its last heartbeat.
func firstClaim(trs []Transition) (gen int64, process string, last time.Time, ok bool) {
	for _, tr := range trs {
		if tr.Status != "PROCESSING" {
			continue
		}
		if !ok {
			gen, process, ok = tr.Generation, tr.Worker, true
		}
		if tr.Generation == gen {
			last = tr.At
		}
	}
	return gen, process, last, ok
}

func firstAttempt(trs []Transition, gen int64) bool {
	g, _, _, ok := firstClaim(trs)
	return ok && g == gen
}

// terminalBy reports whether generation gen ended other than by a reap
// (its handler finished it).
func terminalBy(trs []Transition, gen int64) bool {
	for _, tr := range trs {
		if tr.Generation == gen && terminal(tr.Status) {
			return true
		}
	}
	return false
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.SortFunc(out, cmp.Compare)
	return out
}

// Percentile returns the p-th percentile (0..100, nearest rank) of ds, 0
// for none.
func Percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(float64(len(s))*p/100+0.5) - 1
	return s[min(max(i, 0), len(s)-1)]
}
