package pgstore_test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/jobreaper/jobreaper/internal/pgstore"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
)

// TestPlansHoldOnStaleStatistics checks, on EXPLAIN and not on time, that
// every statement of the reaper that names jobs by ID reads jobs through
// the primary key alone, and that the lost-task search goes through the
// partial index of PROCESSING rows without a parallel plan, however stale
// the statistics.
func TestPlansHoldOnStaleStatistics(t *testing.T) {
	t.Parallel()
	for _, analyzedEmpty := range []bool{false, true} {
		t.Run(fmt.Sprintf("AnalyzedEmpty=%v", analyzedEmpty), func(t *testing.T) {
			t.Parallel()
			db, store := setup(t, nil)
			jobstest.StaleTable(t, db, analyzedEmpty)
			ids := func(prefix string, from, n int) []string {
				out := make([]string, n)
				for i := range out {
					out[i] = fmt.Sprintf("%s%06d", prefix, from+i)
				}
				return out
			}
			gens := func(n int) []int64 { return slices.Repeat([]int64{1}, n) }
			times := func(n int) []time.Time { return slices.Repeat([]time.Time{time.Now()}, n) }
			reapArgs := func(idList []string) pgx.NamedArgs {
				a := pgx.NamedArgs(rule.Args())
				a["ids"], a["generations"], a["updated_ats"], a["reason"] = idList, gens(len(idList)), times(len(idList)), "stalled"
				a["retries"] = slices.Repeat([]bool{true}, len(idList))
				return a
			}
			byID := []struct {
				name string
				sql  string
				args pgx.NamedArgs
			}{
				{"LoadOfTenThousand", pgstore.LoadSQL, pgx.NamedArgs{"ids": ids("p", 5001, 10000)}},
				{"LoadOfOne", pgstore.LoadSQL, pgx.NamedArgs{"ids": ids("p", 7, 1)}},
				{"ReapOfAThousand", pgstore.ReapBatchSQL, reapArgs(ids("p", 6001, 1000))},
				{"ReapOfOne", pgstore.ReapBatchSQL, reapArgs(ids("p", 6001, 1))},
				{"RetryFailOfAThousand", pgstore.FailRetrySQL, pgx.NamedArgs{"ids": ids("p", 6001, 1000), "generations": gens(1000),
					"counts": slices.Repeat([]int32{1}, 1000), "reasons": slices.Repeat([]string{"stalled"}, 1000)}},
				{"ReapLockOfAThousand", pgstore.ReapLockSQL, pgx.NamedArgs{"ids": ids("p", 6001, 1000)}},
				{"MarkersOfAThousandFailedRows", pgstore.MarkersSetSQL, pgx.NamedArgs{"ids": ids("p", 1, 1000), "generations": gens(1000)}},
				{"MarkerOfOneFailedRow", pgstore.MarkersSetSQL, pgx.NamedArgs{"ids": ids("p", 5, 1), "generations": gens(1)}},
				{"FailedMarkersOfAThousandRows", pgstore.MarkersFailedSQL, pgx.NamedArgs{"ids": ids("p", 1, 1000), "generations": gens(1000)}},
			}
			for _, st := range byID {
				args := []any{st.args}
				if st.args == nil {
					args = []any{"p000005"}
				}
				plan, text := jobstest.Explain(t, db, store.Q(st.sql), args...)
				var access []string
				var gather bool
				jobstest.JobsAccess(plan, &access, &gather)
				if len(access) == 0 || slices.ContainsFunc(access, func(a string) bool { return a != "jobs_pkey" }) || gather {
					t.Errorf("%s reads jobs by %v (gather or nested loop %v), want the primary key only, joined by hash:\n%s", st.name, access, gather, text)
				}
			}

			lostArgs := pgx.NamedArgs(rule.Args())
			lostArgs["queues"] = []string{"q0", "q1", "q2", "q3", "q4", "q5", "q6", "q7", "q8", "q9"}
			lostArgs["limit"] = pgstore.LostCandidatesLimitDefault
			lostArgs["after_updated_at"] = pgtype.Timestamptz{InfinityModifier: pgtype.NegativeInfinity, Valid: true}
			lostArgs["after_id"] = ""
			plan, text := jobstest.Explain(t, db, store.Q(pgstore.LostCandidatesSQL), lostArgs)
			var access []string
			var gather bool
			jobstest.JobsAccess(plan, &access, &gather)
			if !slices.Equal(access, []string{"jobs_processing_queue_idx"}) || gather {
				t.Errorf("the lost-task search reads jobs by %v (gather or nested loop %v), want jobs_processing_queue_idx only:\n%s", access, gather, text)
			}

			// The retry-finishing search reads the few QUEUED rows ever
			// retry-reaped through their partial index.
			plan, text = jobstest.Explain(t, db, store.Q(pgstore.RetryPendingSQL), pgx.NamedArgs{
				"queues": lostArgs["queues"], "after": "", "settle": pgtype.Interval{Microseconds: 60e6, Valid: true}, "limit": 500})
			access, gather = nil, false
			jobstest.JobsAccess(plan, &access, &gather)
			if !slices.Equal(access, []string{"jobs_reap_retry_idx"}) {
				t.Errorf("the retry-finishing search reads jobs by %v, want jobs_reap_retry_idx only:\n%s", access, text)
			}
		})
	}
}
