package reaper_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jobreaper/jobreaper/internal/asynqstate"
	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
	"github.com/jobreaper/jobreaper/queue"
	"github.com/jobreaper/jobreaper/reaper"
)

// oddIDs are job IDs a product may really use, that no statement may
// splice into SQL, a key or a log line unescaped: quotes, braces, spaces,
// SQL and format syntax, non-ASCII, exactly jobs.MaxIDLength bytes.
var oddIDs = []string{`it's "quoted"`, "{braces}", "with spaces", "rapport-été-日本", "'; DROP TABLE jobs; --",
	"%s%d\\n", strings.Repeat("k", jobs.MaxIDLength)}

// badPassCase is one kind of bad input met by a real pass: the rows it
// inserts, the active task IDs it lists, and the one skip reason the pass
// must count for them.
type badPassCase struct {
	name  string
	setup func(t *testing.T, b *bundle) (active []string, emptyIDs int)
	skip  reaper.SkipReason
	count int
}

var badPassCases = []badPassCase{
	{name: "TaskWithEmptyID", skip: reaper.SkipNoJobID, count: 2, setup: func(*testing.T, *bundle) ([]string, int) { return nil, 2 }},
	{name: "IDMatchingNoRow", skip: reaper.SkipNoRow, count: 1, setup: func(*testing.T, *bundle) ([]string, int) { return []string{"ghost"}, 0 }},
	{name: "OddIDsMatchingNoRow", skip: reaper.SkipNoRow, count: len(oddIDs), setup: func(*testing.T, *bundle) ([]string, int) { return oddIDs, 0 }},
	{name: "OddIDsOfProgressingJobs", skip: reaper.SkipProgressing, count: len(oddIDs), setup: func(t *testing.T, b *bundle) ([]string, int) {
		for _, id := range oddIDs {
			b.db.Insert(t, jobstest.Job{ID: id, Type: "report.export", Generation: 1, Queue: "default",
				StartedAgo: jobstest.Ago(time.Hour), IdleAgo: 2 * time.Minute})
		}
		return oddIDs, 0
	}},
	{name: "IDsPostgreSQLCannotStore", skip: reaper.SkipBadJobID, count: 4, setup: func(*testing.T, *bundle) ([]string, int) {
		return []string{"nul\x00byte", "bad-utf8-\xff\xfe", strings.Repeat("L", jobs.MaxIDLength+1), "\x00"}, 0
	}},
	{name: "UnknownType", skip: reaper.SkipUnknownType, count: 1, setup: func(t *testing.T, b *bundle) ([]string, int) {
		b.db.Insert(t, jobstest.Job{ID: "odd-type", Type: "no.such.type", Generation: 1, Queue: "default",
			StartedAgo: jobstest.Ago(3 * time.Hour), IdleAgo: time.Hour})
		return []string{"odd-type"}, 0
	}},
	{name: "NullStartedAt", skip: reaper.SkipNoStartTime, count: 1, setup: func(t *testing.T, b *bundle) ([]string, int) {
		b.db.Insert(t, jobstest.Job{ID: "no-start", Type: "report.export", Generation: 1, Queue: "default", IdleAgo: time.Hour})
		return []string{"no-start"}, 0
	}},
	{name: "InfiniteUpdatedAt", skip: reaper.SkipBadRow, count: 1, setup: func(t *testing.T, b *bundle) ([]string, int) {
		b.stalled(t, "inf")
		b.db.Exec(t, `UPDATE jobs SET updated_at = 'infinity' WHERE id = 'inf'`)
		return []string{"inf"}, 0
	}},
	{name: "RowsNotProcessing", skip: reaper.SkipNotProcessing, count: 3, setup: func(t *testing.T, b *bundle) ([]string, int) {
		for id, st := range map[string]string{"q": jobs.StatusQueued, "c": jobs.StatusCompleted, "f": jobs.StatusFailed} {
			b.db.Insert(t, jobstest.Job{ID: id, Type: "report.export", Status: st, Generation: 1, Queue: "default",
				StartedAgo: jobstest.Ago(3 * time.Hour), IdleAgo: time.Hour})
		}
		return []string{"q", "c", "f"}, 0
	}},
	{name: "StallTimeoutTooSmall", skip: reaper.SkipBadLimits, count: 1, setup: limitsCase("120 minutes", "5 minutes", "", 2*time.Hour)},
	{name: "StallTimeoutJustUnderTheMinimum", skip: reaper.SkipBadLimits, count: 1, setup: limitsCase("30 minutes", "00:10:59.999999", "", 2*time.Hour)},
	{name: "HardTimeoutTooShort", skip: reaper.SkipBadLimits, count: 1, setup: limitsCase("30 minutes", "", "40 minutes", 2*time.Hour)},
	{name: "AbsurdlyLargeMaxRuntime", skip: reaper.SkipWithinLimit, count: 1, setup: limitsCase("1000 years", "", "2000 years", 2*time.Hour)},
	{name: "AbsurdlyLargeMaxRuntimeWithTheDefaultHardTimeout", skip: reaper.SkipBadLimits, count: 1, setup: limitsCase("1000 years", "", "", 2*time.Hour)},
	{name: "AbsurdlyLargeStallTimeout", skip: reaper.SkipBadLimits, count: 1, setup: limitsCase("30 minutes", "500 years", "", 2*time.Hour)},
	{name: "LimitsWhoseSumOverflowsAnInterval", skip: reaper.SkipBadLimits, count: 1, setup: limitsCase("2000000000 months", "2000000000 months", "", 2*time.Hour)},
	// An hour and 20 minutes written oddly: sane limits, whose sum only
	// overflows when added as intervals; the job is within its stall
	// timeout, and idle long enough for the lost-task search to judge it.
	{name: "LimitsWithMixedSignComponents", skip: reaper.SkipProgressing, count: 1,
		setup: limitsCase("70000000 mons -2100000000 days 1 hour", "70000000 mons -2100000000 days 20 minutes", "", 12*time.Minute)},
}

// limitsCase inserts one stalled job of a type with the given limits
// (interval literals, "" for NULL), idle for idle.
func limitsCase(maxRuntime, stall, hard string, idle time.Duration) func(t *testing.T, b *bundle) ([]string, int) {
	return func(t *testing.T, b *bundle) ([]string, int) {
		b.db.JobType(t, "odd.limits", maxRuntime, stall, hard)
		b.db.Insert(t, jobstest.Job{ID: "odd-limits", Type: "odd.limits", Generation: 1, Queue: "default",
			StartedAgo: jobstest.Ago(3 * time.Hour), IdleAgo: idle})
		return []string{"odd-limits"}, 0
	}
}

// TestReliabilityBadInput_Pass runs a real pass (reaper.RunOnce over a
// schema of its own, its markers in a miniredis) over each kind of bad
// input next to one stalled job: the bad input is counted under its skip
// reason with no error, its rows are unchanged and get no marker, and the
// stalled job is still reaped (one bad item never stops the others).
func TestReliabilityBadInput_Pass(t *testing.T) {
	t.Parallel()
	tally := jobstest.NewBadInputs(t)
	for _, tc := range badPassCases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tally.Try(t)
			ctx := context.Background()
			b := setup(t)
			b.stalled(t, "control")
			active, empty := tc.setup(t, b)
			b.lister.queues["default"] = asynqstate.ActiveTasks{IDs: append([]string{"control"}, active...), EmptyIDs: empty}
			before := readTables(t, b.db)

			res, err := runOnce(t, ctx, b.reaper)
			if err != nil {
				t.Fatalf("RunOnce: %v", err)
			}
			if res.Errors != 0 || res.Reaped != 1 || res.Skipped[string(tc.skip)] != tc.count {
				t.Fatalf("result = %+v; want 0 errors, only the control job reaped, %d skipped as %s", res, tc.count, tc.skip)
			}
			if got := metricValue(t, b.reg, "jobreaper_jobs_skipped_total", map[string]string{"reason": string(tc.skip)}); got != float64(tc.count) {
				t.Fatalf("jobreaper_jobs_skipped_total{reason=%s} = %v, want %d", tc.skip, got, tc.count)
			}
			if row := b.db.Read(t, "control"); row.Status != jobs.StatusFailed || row.FailureReason != jobs.ReasonStalled {
				t.Fatalf("control = %+v, want FAILED stalled", row)
			}
			after := readTables(t, b.db)
			delete(before.rows, "control")
			delete(after.rows, "control")
			if !equalState(before, after, 1) {
				t.Fatalf("the bad input's rows changed:\nbefore %+v\nafter  %+v", before, after)
			}
			for _, k := range b.redis.Keys() {
				if k != queue.MarkerKey("control") {
					t.Fatalf("marker %q written for a skipped job", k)
				}
			}
		})
	}
}

// tableState is every jobs row as text and the number of events.
type tableState struct {
	rows   map[string]string
	events int64
}

func readTables(t *testing.T, db *jobstest.DB) tableState {
	t.Helper()
	rows, err := db.Pool.Query(context.Background(), `SELECT id, row(j.*)::text FROM jobs j`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	s := tableState{rows: map[string]string{}}
	for rows.Next() {
		var id, text string
		if err := rows.Scan(&id, &text); err != nil {
			t.Fatal(err)
		}
		s.rows[id] = text
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	s.events = db.Count(t, `SELECT count(*) FROM job_events`)
	return s
}

// equalState reports whether the rows are the same and after holds
// exactly newEvents more events.
func equalState(before, after tableState, newEvents int64) bool {
	if len(before.rows) != len(after.rows) || after.events != before.events+newEvents {
		return false
	}
	for id, r := range before.rows {
		if after.rows[id] != r {
			return false
		}
	}
	return true
}
