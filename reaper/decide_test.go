package reaper_test

import (
	"cmp"
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/jobreaper/jobreaper/internal/asynqstate"
	"github.com/jobreaper/jobreaper/internal/pgcore"
	"github.com/jobreaper/jobreaper/internal/pgstore"
	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
	"github.com/jobreaper/jobreaper/reaper"
)

// baselineRule is CASES.md's baseline: stall timeout 15 min, heartbeat 5
// min, interval 1 min, so the smallest sane stall timeout is 11 min.
var baselineRule = pgstore.StallRule{
	DefaultStallTimeout: 15 * time.Minute,
	MinStallTimeout:     11 * time.Minute,
	DefaultHardTimeout:  jobs.HardTimeoutDefault,
}

const us = time.Microsecond

// boundaryCase is one row of the table that Decide and the reap UPDATE must
// answer alike.
type boundaryCase struct {
	name string
	// Interval literals of the job_types row ("" = NULL); no row when
	// maxRuntime is "".
	maxRuntime, stall, hard string
	status                  string // default PROCESSING
	noStart                 bool
	// started, when set, is started_at as a timestamp literal (runtime is
	// then ignored): for start times further back than time.Duration's
	// 292 years.
	started       string
	runtime, idle time.Duration
	// grace sets the rule's outage end outageAgo before now() (a negative
	// outageAgo puts it ahead of now(): a clock that was ahead).
	grace     bool
	outageAgo time.Duration
	want      reaper.SkipReason // "" = reap
}

var boundaryTable = []boundaryCase{
	{name: "RuntimeEqualToLimit", maxRuntime: "30 minutes", runtime: 30 * time.Minute, idle: 20 * time.Minute, want: reaper.SkipWithinLimit},
	{name: "RuntimeJustUnderLimit", maxRuntime: "30 minutes", runtime: 30*time.Minute - us, idle: 20 * time.Minute, want: reaper.SkipWithinLimit},
	{name: "RuntimeJustOverLimit", maxRuntime: "30 minutes", runtime: 30*time.Minute + us, idle: 20 * time.Minute},
	{name: "IdleEqualToDefaultStall", maxRuntime: "30 minutes", runtime: 31 * time.Minute, idle: 15 * time.Minute},
	{name: "IdleJustUnderDefaultStall", maxRuntime: "30 minutes", runtime: 31 * time.Minute, idle: 15*time.Minute - us, want: reaper.SkipProgressing},
	{name: "IdleJustOverDefaultStall", maxRuntime: "30 minutes", runtime: 31 * time.Minute, idle: 15*time.Minute + us},
	{name: "TypeStallEqual", maxRuntime: "60 minutes", stall: "20 minutes", runtime: 61 * time.Minute, idle: 20 * time.Minute},
	{name: "TypeStallJustUnder", maxRuntime: "60 minutes", stall: "20 minutes", runtime: 61 * time.Minute, idle: 20*time.Minute - us, want: reaper.SkipProgressing},
	{name: "TypeStallEqualToMinimumIsSane", maxRuntime: "60 minutes", stall: "11 minutes", runtime: 61 * time.Minute, idle: 11 * time.Minute},
	{name: "TypeStallJustUnderMinimumIsBadLimits", maxRuntime: "60 minutes", stall: "00:10:59.999999", runtime: 2 * time.Hour, idle: time.Hour, want: reaper.SkipBadLimits},
	{name: "TypeStallOfOneHeartbeatIsBadLimits", maxRuntime: "120 minutes", stall: "5 minutes", runtime: 3 * time.Hour, idle: 5 * time.Minute, want: reaper.SkipBadLimits},
	{name: "HardTimeoutEqualToLimitPlusStallIsBadLimits", maxRuntime: "30 minutes", hard: "45 minutes", runtime: 44 * time.Minute, idle: 20 * time.Minute, want: reaper.SkipBadLimits},
	{name: "HardTimeoutJustOverLimitPlusStall", maxRuntime: "30 minutes", hard: "00:45:00.000001", runtime: 44 * time.Minute, idle: 20 * time.Minute},
	{name: "HardTimeoutTooShortForTypeStall", maxRuntime: "30 minutes", stall: "30 minutes", hard: "1 hour", runtime: 59 * time.Minute, idle: 40 * time.Minute, want: reaper.SkipBadLimits},
	{name: "NullHardTimeoutIsTwentyFourHours", maxRuntime: "23 hours 50 minutes", runtime: 23*time.Hour + 55*time.Minute, idle: 20 * time.Minute, want: reaper.SkipBadLimits},
	{name: "DayIntervalsCompareAsTwentyFourHours", maxRuntime: "1 day", hard: "3 days", runtime: 24*time.Hour + us, idle: 15 * time.Minute},
	{name: "DayIntervalJustUnder", maxRuntime: "1 day", hard: "3 days", runtime: 24 * time.Hour, idle: 15 * time.Minute, want: reaper.SkipWithinLimit},
	{name: "CenturiesLongLimitIsWithinLimit", maxRuntime: "1000 years", hard: "2000 years", runtime: 2 * time.Hour, idle: time.Hour, want: reaper.SkipWithinLimit},
	{name: "CenturiesLongHardTimeoutStillReaps", maxRuntime: "30 minutes", hard: "500 years", runtime: 31 * time.Minute, idle: 20 * time.Minute},
	// A placeholder start time (0001-01-01, over 2,000 years back) against
	// limits longer than time.Duration's 292 years: compared exactly, as
	// PostgreSQL compares them.
	{name: "AncientStartPastAThousandYearLimit", maxRuntime: "1000 years", hard: "3000 years", started: "0001-01-01 00:00:00+00", idle: time.Hour},
	{name: "AncientStartWithinAThreeThousandYearLimit", maxRuntime: "3000 years", hard: "6000 years", started: "0001-01-01 00:00:00+00", idle: time.Hour, want: reaper.SkipWithinLimit},
	{name: "ThousandYearLimitWithoutHardTimeoutIsBadLimits", maxRuntime: "1000 years", started: "0001-01-01 00:00:00+00", idle: time.Hour, want: reaper.SkipBadLimits},
	// Limits whose sum is past what an interval holds: max_runtime +
	// stall timeout cannot be computed as an interval ("interval out of
	// range"), yet the row is judged, as bad limits, without an error.
	{name: "LimitsWhoseSumOverflowsAnIntervalAreBadLimits", maxRuntime: "2000000000 months", stall: "2000000000 months", runtime: time.Hour, idle: time.Hour, want: reaper.SkipBadLimits},
	{name: "LimitsWithMixedSignsThatOverflowWhenAdded", maxRuntime: "70000000 months -2100000000 days 1 hour", stall: "70000000 months -2100000000 days 20 minutes",
		hard: "1000 years", started: "0001-01-01 00:00:00+00", idle: 2 * time.Hour},
	{name: "QueuedJobIsNotProcessing", maxRuntime: "30 minutes", status: jobs.StatusQueued, runtime: time.Hour, idle: time.Hour, want: reaper.SkipNotProcessing},
	{name: "QueuedNeverClaimed", maxRuntime: "30 minutes", status: jobs.StatusQueued, noStart: true, idle: 20 * time.Minute, want: reaper.SkipNotProcessing},
	{name: "CompletedJobIsNotProcessing", maxRuntime: "30 minutes", status: jobs.StatusCompleted, runtime: time.Hour, idle: time.Hour, want: reaper.SkipNotProcessing},
	{name: "NullStartTime", maxRuntime: "30 minutes", noStart: true, idle: time.Hour, want: reaper.SkipNoStartTime},
	{name: "UnknownType", runtime: time.Hour, idle: time.Hour, want: reaper.SkipUnknownType},
	// The outage grace: idle time counts from the later of updated_at and
	// the last outage end.
	{name: "OutageEndedJustUnderTheStallTimeoutAgo", maxRuntime: "30 minutes", runtime: time.Hour, idle: 40 * time.Minute,
		grace: true, outageAgo: 15*time.Minute - us, want: reaper.SkipOutageGrace},
	{name: "OutageEndedExactlyTheStallTimeoutAgo", maxRuntime: "30 minutes", runtime: time.Hour, idle: 40 * time.Minute,
		grace: true, outageAgo: 15 * time.Minute},
	{name: "OutageEndedBeforeTheLastProgress", maxRuntime: "30 minutes", runtime: time.Hour, idle: 15 * time.Minute,
		grace: true, outageAgo: 15*time.Minute + us},
	{name: "OutageEndedWithTheLastProgress", maxRuntime: "30 minutes", runtime: time.Hour, idle: 15 * time.Minute,
		grace: true, outageAgo: 15 * time.Minute},
	{name: "OutageEndedJustAfterTheLastProgress", maxRuntime: "30 minutes", runtime: time.Hour, idle: 15 * time.Minute,
		grace: true, outageAgo: 15*time.Minute - us, want: reaper.SkipOutageGrace},
	{name: "ProgressingIsNotOutageGrace", maxRuntime: "30 minutes", runtime: time.Hour, idle: 15*time.Minute - us,
		grace: true, outageAgo: time.Minute, want: reaper.SkipProgressing},
	{name: "WithinLimitIsNotOutageGrace", maxRuntime: "30 minutes", runtime: 30 * time.Minute, idle: 20 * time.Minute,
		grace: true, outageAgo: time.Minute, want: reaper.SkipWithinLimit},
	{name: "OutageGraceWithTheTypesStallTimeout", maxRuntime: "60 minutes", stall: "20 minutes", runtime: 2 * time.Hour, idle: time.Hour,
		grace: true, outageAgo: 20*time.Minute - us, want: reaper.SkipOutageGrace},
	{name: "TheTypesStallTimeoutPassedSinceTheOutage", maxRuntime: "60 minutes", stall: "20 minutes", runtime: 2 * time.Hour, idle: time.Hour,
		grace: true, outageAgo: 20 * time.Minute},
	{name: "OutageEndAheadOfNow", maxRuntime: "30 minutes", runtime: time.Hour, idle: 40 * time.Minute,
		grace: true, outageAgo: -time.Hour, want: reaper.SkipOutageGrace},
	{name: "OutageEndLongAgo", maxRuntime: "30 minutes", runtime: time.Hour, idle: 40 * time.Minute,
		grace: true, outageAgo: 24 * time.Hour},
	{name: "OutageGraceDoesNotMendBadLimits", maxRuntime: "60 minutes", stall: "5 minutes", runtime: 2 * time.Hour, idle: time.Hour,
		grace: true, outageAgo: time.Minute, want: reaper.SkipBadLimits},
	{name: "OutageGraceOnANullStartTime", maxRuntime: "30 minutes", noStart: true, idle: time.Hour,
		grace: true, outageAgo: time.Minute, want: reaper.SkipNoStartTime},
}

// TestDecideAndReapAgreeOnBoundaries runs every row against the pure
// Decide and against every SQL form of pgstore.StallPredicate, the reap
// UPDATE, the set-based ListLostCandidates and StalledWithoutQueue, inside
// one transaction, whose now() does not move, so all see the same clock to
// the microsecond. All must give the row's answer.
func TestDecideAndReapAgreeOnBoundaries(t *testing.T) {
	t.Parallel()
	db := jobstest.New(t)
	ctx := context.Background()
	for i, tc := range boundaryTable {
		t.Run(tc.name, func(t *testing.T) {
			tx, err := db.Pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = tx.Rollback(ctx) }()
			id, typ := fmt.Sprintf("job-%d", i), fmt.Sprintf("type-%d", i)
			insertBoundaryRow(t, tx, tc, id, typ)

			store := pgstore.New(tx, pgstore.WithSchema(db.Schema))
			now, err := store.Now(ctx)
			if err != nil {
				t.Fatal(err)
			}
			rule := baselineRule
			if tc.grace {
				rule.OutageEnd = now.Add(-tc.outageAgo)
			}
			var snap *jobs.Snapshot
			if s, err := store.Get(ctx, id); err == nil {
				snap = &s
			} else {
				t.Fatal(err)
			}
			v := reaper.Decide(snap, now, rule)
			if v.Reap != (tc.want == "") || v.Skip != tc.want {
				t.Errorf("Decide = reap %v skip %q; want skip %q (runtime %v idle %v)", v.Reap, v.Skip, tc.want, v.Runtime, v.Idle)
			}
			lost, err := store.ListLostCandidates(ctx, pgstore.LostCandidatesParams{Queues: []string{"boundary"}, Rule: rule})
			if err != nil {
				t.Fatal(err)
			}
			// The search also returns, once idle past the stall floor, the
			// rows the rule cannot judge, so that the pass counts them
			// (Decide names them; none is reaped): those may be found.
			unjudgeable := tc.want == reaper.SkipBadLimits || tc.want == reaper.SkipUnknownType ||
				tc.want == reaper.SkipNoStartTime || tc.want == reaper.SkipBadRow
			if found := len(lost) == 1 && lost[0].ID == id; found != (tc.want == "") && !(unjudgeable && found) {
				t.Errorf("set-based ListLostCandidates found the job: %v; Decide says %q", found, tc.want)
			}
			if _, err := tx.Exec(ctx, `UPDATE jobs SET queue = NULL WHERE id = $1`, id); err != nil {
				t.Fatal(err)
			}
			noQueue, err := store.StalledWithoutQueue(ctx, rule, 10)
			if err != nil {
				t.Fatal(err)
			}
			if found := len(noQueue) == 1 && noQueue[0] == id; found != (tc.want == "") {
				t.Errorf("StalledWithoutQueue found the job: %v; Decide says %q", found, tc.want)
			}
			if _, err := tx.Exec(ctx, `UPDATE jobs SET queue = 'boundary' WHERE id = $1`, id); err != nil {
				t.Fatal(err)
			}
			reaped, ev, err := store.Reap(ctx, pgstore.ReapParams{JobID: id, Generation: snap.Generation,
				UpdatedAt: snap.UpdatedAt, Reason: jobs.ReasonStalled, Rule: rule})
			if err != nil {
				t.Fatal(err)
			}
			if reaped != (tc.want == "") {
				t.Errorf("reap UPDATE reaped = %v; Decide says %q", reaped, tc.want)
			}
			// The evidence names the outage end it counted idle time from.
			if wantEnd := tc.grace && reaped && rule.OutageEnd.After(snap.UpdatedAt); (ev.OutageEnd != nil) != wantEnd ||
				wantEnd && !ev.OutageEnd.Equal(rule.OutageEnd) {
				t.Errorf("evidence outage end %v, want %v (%v)", ev.OutageEnd, wantEnd, rule.OutageEnd)
			}
			var status string
			if err := tx.QueryRow(ctx, `SELECT status FROM jobs WHERE id = $1`, id).Scan(&status); err != nil {
				t.Fatal(err)
			}
			wantStatus := cmp.Or(tc.status, jobs.StatusProcessing)
			if reaped {
				wantStatus = jobs.StatusFailed
			}
			if status != wantStatus {
				t.Errorf("status = %s, want %s", status, wantStatus)
			}
		})
	}
	t.Run("DecideWithoutRowIsNoRow", func(t *testing.T) {
		if v := reaper.Decide(nil, time.Now(), baselineRule); v.Reap || v.Skip != reaper.SkipNoRow {
			t.Fatalf("Decide(nil) = %+v", v)
		}
	})
}

func insertBoundaryRow(t *testing.T, tx pgx.Tx, tc boundaryCase, id, typ string) {
	t.Helper()
	ctx := context.Background()
	if tc.maxRuntime != "" {
		if _, err := tx.Exec(ctx, `INSERT INTO job_types (name, max_runtime, stall_timeout, hard_timeout)
VALUES ($1, $2::interval, nullif($3, '')::interval, nullif($4, '')::interval)`, typ, tc.maxRuntime, tc.stall, tc.hard); err != nil {
			t.Fatal(err)
		}
	}
	started := any(pgcore.Interval(tc.runtime))
	if tc.noStart {
		started = nil
	}
	if _, err := tx.Exec(ctx, `INSERT INTO jobs (id, type, status, generation, queue, started_at, updated_at)
VALUES ($1, $2, $3, 1, 'boundary', coalesce(nullif($6, '')::timestamptz, now() - $4::interval), now() - $5::interval)`,
		id, typ, cmp.Or(tc.status, jobs.StatusProcessing), started, pgcore.Interval(tc.idle), tc.started); err != nil {
		t.Fatal(err)
	}
}

// A rule read from a configuration can carry nanoseconds (stall_timeout:
// 14m59.999999969s); PostgreSQL receives it as an interval of whole
// microseconds. Decide judges with the rule as PostgreSQL sees it, so that
// a job idle for exactly that many microseconds gets the reap UPDATE's
// verdict (found by FuzzDecideMatchesStallPredicate).
func TestDecideJudgesTheRuleInWholeMicroseconds(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)
	started := now.Add(-31 * time.Minute)
	rule := pgstore.StallRule{DefaultStallTimeout: 15*time.Minute - 31*time.Nanosecond,
		MinStallTimeout: 11*time.Minute - 28*time.Nanosecond, DefaultHardTimeout: jobs.HardTimeoutDefault + 999*time.Nanosecond}
	for _, tc := range []struct {
		name string
		idle time.Duration
		reap bool
	}{
		{"IdleEqualToTheStallTimeoutInMicroseconds", 15*time.Minute - time.Microsecond, true},
		{"IdleOneMicrosecondShort", 15*time.Minute - 2*time.Microsecond, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			snap := &jobs.Snapshot{ID: "J", Type: "t", Status: jobs.StatusProcessing, Generation: 1,
				StartedAt: &started, UpdatedAt: now.Add(-tc.idle), Limits: &jobs.Limits{MaxRuntime: 30 * time.Minute}}
			if v := reaper.Decide(snap, now, rule); v.Reap != tc.reap {
				t.Fatalf("Decide = %+v, want reap %v", v, tc.reap)
			}
		})
	}
	t.Run("TypeStallEqualToTheMinimumInMicroseconds", func(t *testing.T) {
		stall := 11*time.Minute - time.Microsecond
		snap := &jobs.Snapshot{ID: "J", Type: "t", Status: jobs.StatusProcessing, Generation: 1,
			StartedAt: &started, UpdatedAt: now.Add(-time.Hour), Limits: &jobs.Limits{MaxRuntime: 30 * time.Minute, StallTimeout: &stall}}
		if v := reaper.Decide(snap, now, rule); !v.Reap {
			t.Fatalf("Decide = %+v, want reap: the stall timeout equals the minimum PostgreSQL compares with", v)
		}
	})
}

func TestDecideRetry(t *testing.T) {
	t.Parallel()
	budget := func(count, retries int) pgcore.ReapBudget {
		return pgcore.ReapBudget{Count: count, Retries: retries, Delay: time.Minute}
	}
	for _, c := range []struct {
		name   string
		b      pgcore.ReapBudget
		reason string
		task   asynqstate.TaskStatus
		want   reaper.RetryPlan
	}{
		{"StalledWithBudgetLeft", budget(0, 1), jobs.ReasonStalled, asynqstate.TaskActive, reaper.PlanRetry},
		{"StalledWithItsLastRetry", budget(1, 2), jobs.ReasonStalled, asynqstate.TaskActive, reaper.PlanRetry},
		{"StalledWithTheBudgetSpent", budget(2, 2), jobs.ReasonStalled, asynqstate.TaskActive, reaper.PlanFail},
		{"StalledWithoutABudget", budget(0, 0), jobs.ReasonStalled, asynqstate.TaskActive, reaper.PlanFail},
		{"LostArchived", budget(0, 1), jobs.ReasonLostTask, asynqstate.TaskArchived, reaper.PlanRetry},
		{"LostCompleted", budget(0, 1), jobs.ReasonLostTask, asynqstate.TaskCompleted, reaper.PlanRetry},
		{"LostGone", budget(0, 1), jobs.ReasonLostTask, asynqstate.TaskNotFound, reaper.PlanRetryImpossible},
		{"LostQueueForgotten", budget(0, 1), jobs.ReasonLostTask, asynqstate.TaskQueueNotFound, reaper.PlanRetryImpossible},
		{"LostGoneWithTheBudgetSpent", budget(1, 1), jobs.ReasonLostTask, asynqstate.TaskNotFound, reaper.PlanFail},
	} {
		if got := reaper.DecideRetry(c.b, c.reason, c.task); got != c.want {
			t.Errorf("%s: DecideRetry = %d, want %d", c.name, got, c.want)
		}
	}
	for _, c := range []struct {
		delay time.Duration
		count int
		want  time.Duration
	}{
		{time.Minute, 1, time.Minute}, {time.Minute, 2, 2 * time.Minute}, {time.Minute, 4, 8 * time.Minute},
		{0, 3, 0}, {jobs.MaxDuration / 2, 3, jobs.MaxDuration},
	} {
		if got := reaper.RetryDelay(c.delay, c.count); got != c.want {
			t.Errorf("RetryDelay(%v, %d) = %v, want %v", c.delay, c.count, got, c.want)
		}
	}
}
