package pgstore_test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/jobreaper/jobreaper/internal/pgcore"
	"github.com/jobreaper/jobreaper/internal/pgstore"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
)

// TestReconcilePlansUseTheirIndexes checks, on EXPLAIN over stale
// statistics, that the reconciliation's statements read jobs through an
// index, never a sequential scan: the marker re-assertion's page and count
// over the reaps of 7 days, the stale QUEUED page, the queues of PROCESSING
// rows and the stalled rows without a queue.
func TestReconcilePlansUseTheirIndexes(t *testing.T) {
	t.Parallel()
	for _, analyzedEmpty := range []bool{false, true} {
		t.Run(fmt.Sprintf("AnalyzedEmpty=%v", analyzedEmpty), func(t *testing.T) {
			t.Parallel()
			db, store := setup(t, nil)
			jobstest.StaleTable(t, db, analyzedEmpty)
			db.Exec(t, `INSERT INTO jobs (id, type, status, queue, updated_at)
SELECT 'w' || lpad(i::text, 6, '0'), 'report.export', 'QUEUED', 'q' || (i % 10), now() - (i * interval '1 second')
  FROM generate_series(1, 20000) AS i`)
			now := time.Now()
			reaped := pgx.NamedArgs{"now": now, "within": pgcore.Interval(7 * 24 * time.Hour), "after_at": "-infinity", "after_id": "", "limit": 1000}
			stale := pgx.NamedArgs{"default_queue": pgstore.QueueDefault, "older": pgcore.Interval(time.Hour), "after_updated_at": "-infinity",
				"after_id": "", "queues": []string{}, "limit": 1000}
			noQueue := pgx.NamedArgs(rule.Args())
			noQueue["limit"] = 10000
			for _, st := range []struct {
				name string
				sql  string
				args pgx.NamedArgs
				want []string
			}{
				{"ReapedPage", pgstore.ReapedSQL, reaped, []string{"jobs_reaped_window_idx", "jobs_failed_finished_idx"}},
				{"ReapedCount", pgstore.ReapedCountSQL, reaped, []string{"jobs_reaped_window_idx", "jobs_failed_finished_idx"}},
				{"StaleQueuedPage", pgstore.StaleQueuedSQL, stale, []string{"jobs_queued_updated_idx"}},
				{"ProcessingQueues", pgstore.ProcessingQueuesSQL, nil, []string{"jobs_processing_queue_idx"}},
				{"StalledWithoutQueue", pgstore.NoQueueSQL, noQueue, []string{"jobs_processing_queue_idx"}},
			} {
				var args []any
				if st.args != nil {
					args = []any{st.args}
				}
				plan := jobstest.ExplainPlain(t, db, store.Q(st.sql), args...)
				var access []string
				var gather bool // a parallel plan is fine for these scans
				jobstest.JobsAccess(plan, &access, &gather)
				if len(access) == 0 || slices.ContainsFunc(access, func(a string) bool { return !slices.Contains(st.want, a) }) {
					t.Errorf("%s reads jobs by %v, want one of %v", st.name, access, st.want)
				}
			}
		})
	}
}
