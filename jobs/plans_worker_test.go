package jobs_test

import (
	"fmt"
	"slices"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
)

// TestWorkerPlansHoldOnStaleStatistics checks, on EXPLAIN, that every
// statement a worker sends for one job reads jobs
// through the primary key, however stale the statistics: a statement that
// names status = 'PROCESSING' (or 'FAILED', 'QUEUED') must not be planned
// on a partial index of that status, whose statistics can say it is empty
// while it holds every such row (a heartbeat would then scan them all).
func TestWorkerPlansHoldOnStaleStatistics(t *testing.T) {
	t.Parallel()
	for _, analyzedEmpty := range []bool{false, true} {
		t.Run(fmt.Sprintf("AnalyzedEmpty=%v", analyzedEmpty), func(t *testing.T) {
			t.Parallel()
			db, store := setup(t, nil)
			jobstest.StaleTable(t, db, analyzedEmpty)
			lease := pgx.NamedArgs{"job_id": "p000007", "generation": int64(1), "worker": "w", "expected_generation": int64(1),
				"progress": int64(5), "code": "no_completion", "cursor_after": int64(10), "expected_cursor": int64(0), "total": int64(100),
				"id": "p000007", "status": "FAILED"}
			for _, st := range []struct {
				name string
				sql  string
				args []any
			}{
				{"Heartbeat", jobs.HeartbeatSQL, []any{lease}},
				{"Complete", jobs.CompleteSQL, []any{lease}},
				{"CheckCompleted", jobs.CheckCompletedSQL, []any{"p000007"}},
				{"Fail", jobs.FailSQL, []any{lease}},
				{"Claim", jobs.ClaimSQL, []any{lease}},
				{"Release", jobs.ReleaseSQL, []any{lease}},
				{"AutoComplete", jobs.AutoCompleteSQL, []any{lease}},
				{"AutoState", jobs.AutoStateSQL, []any{"p000007"}},
				{"AdvanceLock", jobs.AdvanceLockSQL, []any{"p000007"}},
				{"MoveCursor", jobs.MoveCursorSQL, []any{lease}},
				{"SetTotal", jobs.SetTotalSQL, []any{lease}},
			} {
				plan := jobstest.ExplainPlain(t, db, store.Q(st.sql), st.args...)
				var access []string
				var gather bool
				jobstest.JobsAccess(plan, &access, &gather)
				if len(access) == 0 || slices.ContainsFunc(access, func(a string) bool { return a != "jobs_pkey" }) {
					t.Errorf("%s reads jobs by %v, want the primary key only", st.name, access)
				}
			}
		})
	}
}

// TestStateReadPlanHoldsOnStaleStatistics checks the read that answers a
// refused fenced write (a job's status and generation by ID) as the
// daemon's statements by ID are checked: behind the plan settings that
// pin the others, it still reads jobs through the primary key alone.
func TestStateReadPlanHoldsOnStaleStatistics(t *testing.T) {
	t.Parallel()
	for _, analyzedEmpty := range []bool{false, true} {
		t.Run(fmt.Sprintf("AnalyzedEmpty=%v", analyzedEmpty), func(t *testing.T) {
			t.Parallel()
			db, store := setup(t, nil)
			jobstest.StaleTable(t, db, analyzedEmpty)
			plan, text := jobstest.Explain(t, db, store.Q(jobs.ReadStateSQL), "p000005")
			var access []string
			var gather bool
			jobstest.JobsAccess(plan, &access, &gather)
			if len(access) == 0 || slices.ContainsFunc(access, func(a string) bool { return a != "jobs_pkey" }) || gather {
				t.Errorf("StateOfOne reads jobs by %v (gather or nested loop %v), want the primary key only, joined by hash:\n%s", access, gather, text)
			}
		})
	}
}
