package reaper_test

import (
	"context"
	"errors"
	"math"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/jobreaper/jobreaper/internal/pgstore"
	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
	"github.com/jobreaper/jobreaper/reaper"
)

// decideInput is one input of FuzzDecideMatchesStallPredicate: a job row,
// its type's limits and the daemon's rule, as the fuzzer varies them.
type decideInput struct {
	// flags: bits 0-1 the status (QUEUED, PROCESSING, COMPLETED, FAILED),
	// bit 2 no job_types row, bit 3 started_at NULL, bits 4-5 started_at
	// finite/+infinity/-infinity, bits 6-7 the same for updated_at.
	flags uint8
	// The type's limits, each an interval of months, days and
	// microseconds as PostgreSQL stores it; stall and hard are NULL unless
	// their *Set is true.
	maxMon, maxDay     int32
	maxUs              int64
	stallSet           bool
	stallMon, stallDay int32
	stallUs            int64
	hardSet            bool
	hardMon, hardDay   int32
	hardUs             int64
	relative           bool
	runUs, idleUs      int64
	defStall, minStall int64 // nanoseconds, made positive
	defHard            int64 // nanoseconds, made positive
	// outageSet gives the rule an outage end, outageUs microseconds before
	// now() (in relative mode: the stall timeout plus a small offset
	// before it, so that the grace's boundary is hit).
	outageSet bool
	outageUs  int64
}

// The widest runtime and idle time an input may give: started_at and
// updated_at stay within PostgreSQL's timestamp range (4713 BC to
// 294276 AD) from now() either way, so that every input is judged.
const spanUs = 6000 * 365 * 24 * int64(time.Hour/time.Microsecond)

var fuzzStatuses = [...]string{jobs.StatusQueued, jobs.StatusProcessing, jobs.StatusCompleted, jobs.StatusFailed}

// FuzzDecideMatchesStallPredicate holds reaper.Decide and the SQL
// pgstore.StallPredicate to the same verdict for the same row, type and rule:
// the row is written in a transaction whose now() does not move (rolled
// back at the end), read back through jobs.Store.Get and judged by Decide
// on the database's now(), then by both SQL forms of the predicate, the
// lost-task search (ListLostCandidates) and the reap UPDATE (Reap). The
// limits are intervals of months, days and microseconds, as an operator
// can write them (absurdly large ones included); the rule's durations
// carry nanoseconds, as a configuration can, and may carry an outage end
// (the outage grace: idle time counted from the later of updated_at and
// it). Neither SQL form may fail for an input the schema accepts.
//
// In relative mode the runtime and idle time are the limits plus a small
// offset, so that the fuzzer lands on the boundaries (equal, one
// microsecond either side) rather than only far from them.
func FuzzDecideMatchesStallPredicate(f *testing.F) {
	const (
		minute = int64(time.Minute / time.Microsecond)
		hour   = 60 * minute
		nsMin  = int64(time.Minute)
	)
	processing := uint8(1)
	// Seeds: the boundary table's shapes, in relative mode (offset 0 is
	// the boundary itself) and absolute mode.
	f.Add(processing, int32(0), int32(0), 30*minute, false, int32(0), int32(0), int64(0), false, int32(0), int32(0), int64(0),
		true, int64(0), int64(1), 15*nsMin, 11*nsMin, 24*60*nsMin, false, int64(0))
	f.Add(processing, int32(0), int32(0), 30*minute, false, int32(0), int32(0), int64(0), false, int32(0), int32(0), int64(0),
		true, int64(1), int64(0), 15*nsMin, 11*nsMin, 24*60*nsMin, false, int64(0))
	f.Add(processing, int32(0), int32(0), 30*minute, false, int32(0), int32(0), int64(0), false, int32(0), int32(0), int64(0),
		true, int64(1), int64(-1), 15*nsMin, 11*nsMin, 24*60*nsMin, false, int64(0))
	f.Add(processing, int32(0), int32(0), 60*minute, true, int32(0), int32(0), 20*minute, false, int32(0), int32(0), int64(0),
		true, int64(1), int64(0), 15*nsMin, 11*nsMin, 24*60*nsMin, false, int64(0))
	f.Add(processing, int32(0), int32(0), 60*minute, true, int32(0), int32(0), 11*minute, false, int32(0), int32(0), int64(0),
		true, int64(1), int64(0), 15*nsMin, 11*nsMin, 24*60*nsMin, false, int64(0))
	f.Add(processing, int32(0), int32(0), 60*minute, true, int32(0), int32(0), 11*minute-1, false, int32(0), int32(0), int64(0),
		true, int64(1), int64(0), 15*nsMin, 11*nsMin, 24*60*nsMin, false, int64(0))
	f.Add(processing, int32(0), int32(0), 30*minute, false, int32(0), int32(0), int64(0), true, int32(0), int32(0), 45*minute,
		true, int64(1), int64(0), 15*nsMin, 11*nsMin, 24*60*nsMin, false, int64(0))
	f.Add(processing, int32(0), int32(0), 30*minute, false, int32(0), int32(0), int64(0), true, int32(0), int32(0), 45*minute+1,
		true, int64(1), int64(0), 15*nsMin, 11*nsMin, 24*60*nsMin, false, int64(0))
	f.Add(processing, int32(0), int32(1), int64(0), false, int32(0), int32(0), int64(0), true, int32(0), int32(3), int64(0),
		true, int64(1), int64(0), 15*nsMin, 11*nsMin, 24*60*nsMin, false, int64(0))
	f.Add(processing, int32(1), int32(0), int64(0), false, int32(0), int32(0), int64(0), true, int32(2), int32(0), int64(0),
		true, int64(0), int64(0), 15*nsMin, 11*nsMin, 24*60*nsMin, false, int64(0))
	f.Add(processing, int32(12000), int32(0), int64(0), false, int32(0), int32(0), int64(0), true, int32(24000), int32(0), int64(0),
		false, 2*hour, hour, 15*nsMin, 11*nsMin, 24*60*nsMin, false, int64(0))
	f.Add(processing, int32(0), int32(0), 30*minute, false, int32(0), int32(0), int64(0), true, int32(6000), int32(0), int64(0),
		false, 31*minute, 20*minute, 15*nsMin, 11*nsMin, 24*60*nsMin, false, int64(0))
	f.Add(processing|8, int32(0), int32(0), 30*minute, false, int32(0), int32(0), int64(0), false, int32(0), int32(0), int64(0),
		false, int64(0), hour, 15*nsMin, 11*nsMin, 24*60*nsMin, false, int64(0))
	f.Add(processing|4, int32(0), int32(0), 30*minute, false, int32(0), int32(0), int64(0), false, int32(0), int32(0), int64(0),
		false, hour, hour, 15*nsMin, 11*nsMin, 24*60*nsMin, false, int64(0))
	f.Add(processing|16, int32(0), int32(0), 30*minute, false, int32(0), int32(0), int64(0), false, int32(0), int32(0), int64(0),
		false, hour, hour, 15*nsMin, 11*nsMin, 24*60*nsMin, false, int64(0))
	f.Add(processing, int32(math.MaxInt32), int32(0), int64(0), true, int32(math.MaxInt32), int32(0), int64(0), false, int32(0), int32(0), int64(0),
		false, hour, hour, 15*nsMin, 11*nsMin, 24*60*nsMin, false, int64(0))
	f.Add(uint8(0), int32(0), int32(0), 30*minute, false, int32(0), int32(0), int64(0), false, int32(0), int32(0), int64(0),
		false, hour, hour, 15*nsMin, 11*nsMin, 24*60*nsMin, false, int64(0))
	// The outage grace's boundary: the outage ended exactly the stall
	// timeout ago (reap), one microsecond later (held), and long before
	// the last progress (reap).
	f.Add(processing, int32(0), int32(0), 30*minute, false, int32(0), int32(0), int64(0), false, int32(0), int32(0), int64(0),
		true, int64(1), int64(600_000), 15*nsMin, 11*nsMin, 24*60*nsMin, true, int64(0))
	f.Add(processing, int32(0), int32(0), 30*minute, false, int32(0), int32(0), int64(0), false, int32(0), int32(0), int64(0),
		true, int64(1), int64(600_000), 15*nsMin, 11*nsMin, 24*60*nsMin, true, int64(-1))
	f.Add(processing, int32(0), int32(0), 60*minute, true, int32(0), int32(0), 20*minute, false, int32(0), int32(0), int64(0),
		false, 2*hour, hour, 15*nsMin, 11*nsMin, 24*60*nsMin, true, 3*hour)

	db := jobstest.New(f)
	f.Fuzz(func(t *testing.T, flags uint8,
		maxMon, maxDay int32, maxUs int64,
		stallSet bool, stallMon, stallDay int32, stallUs int64,
		hardSet bool, hardMon, hardDay int32, hardUs int64,
		relative bool, runUs, idleUs int64,
		defStall, minStall, defHard int64, outageSet bool, outageUs int64) {
		in := decideInput{flags: flags, maxMon: maxMon, maxDay: maxDay, maxUs: maxUs,
			stallSet: stallSet, stallMon: stallMon, stallDay: stallDay, stallUs: stallUs,
			hardSet: hardSet, hardMon: hardMon, hardDay: hardDay, hardUs: hardUs,
			relative: relative, runUs: runUs, idleUs: idleUs, defStall: defStall, minStall: minStall, defHard: defHard,
			outageSet: outageSet, outageUs: outageUs}
		checkDecideAgainstSQL(t, db, in)
	})
}

// positive maps any int64 to a positive duration, keeping small values as
// they are so that the fuzzer's nanosecond offsets survive.
func positive(ns int64) time.Duration {
	if ns == math.MinInt64 {
		return time.Duration(math.MaxInt64)
	}
	if ns < 0 {
		ns = -ns
	}
	return time.Duration(max(ns, 1))
}

// wrapSpan folds us into [-spanUs, spanUs].
func wrapSpan(us int64) int64 { return us % (spanUs + 1) }

// outageSpanUs bounds how far from now() an input's outage end lies, either
// way: 200 years, within time.Duration's range.
const outageSpanUs = 200 * 365 * 24 * int64(time.Hour/time.Microsecond)

// intervalUs returns the interval's length in microseconds as PostgreSQL
// compares it (30-day months, 24-hour days), and false when that does not
// fit an int64.
func intervalUs(mon, day int32, us int64) (int64, bool) {
	const dayUs = 24 * int64(time.Hour/time.Microsecond)
	days := int64(mon)*30 + int64(day)
	if days > math.MaxInt64/dayUs || days < math.MinInt64/dayUs {
		return 0, false
	}
	sum := days*dayUs + us
	if (us > 0 && sum < days*dayUs) || (us < 0 && sum > days*dayUs) {
		return 0, false
	}
	return sum, true
}

func checkDecideAgainstSQL(t *testing.T, db *jobstest.DB, in decideInput) {
	t.Helper()
	ctx := context.Background()
	rule := pgstore.StallRule{DefaultStallTimeout: positive(in.defStall), MinStallTimeout: positive(in.minStall),
		DefaultHardTimeout: positive(in.defHard)}
	status := fuzzStatuses[in.flags&3]
	knownType := in.flags&4 == 0
	noStart := in.flags&8 != 0
	inf := func(bits uint8) pgtype.InfinityModifier {
		switch bits & 3 {
		case 1:
			return pgtype.Infinity
		case 2:
			return pgtype.NegativeInfinity
		}
		return pgtype.Finite
	}
	startedInf, updatedInf := inf(in.flags>>4), inf(in.flags>>6)

	// The runtime and idle time: absolute, or the limit plus a small
	// offset (the rule's durations as PostgreSQL receives them:
	// microseconds, truncated).
	run, idle := wrapSpan(in.runUs), wrapSpan(in.idleUs)
	if in.relative {
		if m, ok := intervalUs(in.maxMon, in.maxDay, in.maxUs); ok {
			run = wrapSpan(m) + in.runUs%1_000_000
		}
		stall := rule.DefaultStallTimeout.Microseconds()
		if in.stallSet {
			if s, ok := intervalUs(in.stallMon, in.stallDay, in.stallUs); ok {
				stall = s
			}
		}
		idle = wrapSpan(stall) + in.idleUs%1_000_000
	}
	// The outage end's distance before now(): absolute, or the stall
	// timeout plus a small offset.
	outageAgo := in.outageUs % (outageSpanUs + 1)
	if in.relative {
		stall := rule.DefaultStallTimeout.Microseconds()
		if in.stallSet {
			if s, ok := intervalUs(in.stallMon, in.stallDay, in.stallUs); ok {
				stall = s
			}
		}
		outageAgo = min(stall, outageSpanUs) + in.outageUs%1_000_000
	}

	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	iv := func(set bool, mon, day int32, us int64) pgtype.Interval {
		return pgtype.Interval{Months: mon, Days: day, Microseconds: us, Valid: set}
	}
	if knownType {
		_, err := tx.Exec(ctx, `INSERT INTO job_types (name, max_runtime, stall_timeout, hard_timeout) VALUES ('fz', $1, $2, $3)`,
			iv(true, in.maxMon, in.maxDay, in.maxUs), iv(in.stallSet, in.stallMon, in.stallDay, in.stallUs),
			iv(in.hardSet, in.hardMon, in.hardDay, in.hardUs))
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "23514" {
			return // the schema refuses a limit that is not positive
		}
		if err != nil {
			t.Fatalf("inserting the type: %v", err)
		}
	}
	started := pgtype.Timestamptz{InfinityModifier: startedInf, Valid: !noStart}
	updated := pgtype.Timestamptz{InfinityModifier: updatedInf, Valid: true}
	if _, err := tx.Exec(ctx, `INSERT INTO jobs (id, type, status, generation, queue, started_at, updated_at)
VALUES ('J', 'fz', $1, 1, 'fz',
        CASE WHEN $2::timestamptz IS NULL THEN NULL WHEN isfinite($2::timestamptz) THEN now() - $3::interval ELSE $2 END,
        CASE WHEN isfinite($4::timestamptz) THEN now() - $5::interval ELSE $4 END)`,
		status, started, pgtype.Interval{Microseconds: run, Valid: true}, updated, pgtype.Interval{Microseconds: idle, Valid: true}); err != nil {
		t.Fatalf("inserting the job: %v", err)
	}

	store := pgstore.New(tx, pgstore.WithSchema(db.Schema))
	now, err := store.Now(ctx)
	if err != nil {
		t.Fatal(err)
	}
	snap, err := store.Get(ctx, "J")
	if err != nil {
		t.Fatalf("reading the job back: %v", err)
	}
	if in.outageSet {
		rule.OutageEnd = now.Add(-time.Duration(outageAgo) * time.Microsecond)
	}
	v := reaper.Decide(&snap, now, rule)
	describe := func() string {
		outage := "none"
		if in.outageSet {
			outage = strconv.FormatInt(outageAgo, 10) + "µs ago"
		}
		return "row " + status + " runtime " + strconv.FormatInt(run, 10) + "µs idle " + strconv.FormatInt(idle, 10) + "µs outage end " + outage +
			"; Decide: " + verdictString(v) + "; rule " + rule.DefaultStallTimeout.String() + "/" + rule.MinStallTimeout.String() + "/" +
			rule.DefaultHardTimeout.String()
	}

	lost, err := store.ListLostCandidates(ctx, pgstore.LostCandidatesParams{Queues: []string{"fz"}, Rule: rule})
	if err != nil {
		t.Fatalf("ListLostCandidates failed on an input the schema accepts: %v (%s)", err, describe())
	}
	// The search also returns the rows the rule cannot judge (the pass
	// counts them under Decide's skip): found, they are no reap either.
	unjudgeable := !v.Reap && (v.Skip == reaper.SkipBadLimits || v.Skip == reaper.SkipUnknownType ||
		v.Skip == reaper.SkipNoStartTime || v.Skip == reaper.SkipBadRow)
	foundStalled := len(lost) == 1 && lost[0].Unreadable == "" && !unjudgeable
	if foundStalled != v.Reap {
		t.Errorf("lost-task search finds the job stalled: %v; %s", foundStalled, describe())
	}
	if _, err := tx.Exec(ctx, `UPDATE jobs SET queue = NULL WHERE id = 'J'`); err != nil {
		t.Fatal(err)
	}
	noQueue, err := store.StalledWithoutQueue(ctx, rule, 10)
	if err != nil {
		t.Fatalf("StalledWithoutQueue failed on an input the schema accepts: %v (%s)", err, describe())
	}
	if found := len(noQueue) == 1; found != v.Reap {
		t.Errorf("StalledWithoutQueue finds the job stalled: %v; %s", found, describe())
	}
	if _, err := tx.Exec(ctx, `UPDATE jobs SET queue = 'fz' WHERE id = 'J'`); err != nil {
		t.Fatal(err)
	}
	reaped, _, err := store.Reap(ctx, pgstore.ReapParams{JobID: "J", Generation: snap.Generation, UpdatedAt: snap.UpdatedAt,
		Reason: jobs.ReasonStalled, Rule: rule})
	if err != nil {
		t.Fatalf("the reap UPDATE failed on an input the schema accepts: %v (%s)", err, describe())
	}
	if reaped != v.Reap {
		t.Errorf("the reap UPDATE reaped: %v; %s", reaped, describe())
	}
}

func verdictString(v reaper.Verdict) string {
	if v.Reap {
		return "reap"
	}
	s := "skip " + string(v.Skip)
	if v.Why != "" {
		s += " (" + v.Why + ")"
	}
	return s
}
