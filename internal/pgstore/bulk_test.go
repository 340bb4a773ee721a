package pgstore_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/jobreaper/jobreaper/internal/pgcore"
	"github.com/jobreaper/jobreaper/internal/pgstore"
	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
)

// TestSelectJobs: the filter selects by status, type, queue (NULL counts
// as default), failure and time, counts every match, returns the oldest
// first up to the limit, and refuses an unscoped or unbounded filter.
func TestSelectJobs(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, store := setup(t, nil)
	failed := func(id, typ, queue, reason, ago string) {
		db.Insert(t, jobstest.Job{ID: id, Type: typ, Status: jobs.StatusQueued, Queue: queue})
		db.Exec(t, `UPDATE jobs SET status = 'FAILED', failure_reason = $2, finished_at = now() - $3::interval WHERE id = $1`, id, reason, ago)
	}
	failed("F1", "report.export", "q", "stalled", "30 minutes")
	failed("F2", "report.export", "", "lost_task", "20 minutes") // no queue: default
	failed("F3", "report.export", "q", "cancelled", "10 minutes")
	failed("F4", "report.export", "q", "stalled", "3 hours")
	db.Insert(t, jobstest.Job{ID: "Q1", Type: "report.export", Status: jobs.StatusQueued, Queue: "q"})

	sel, err := store.daemon.SelectJobs(ctx, pgstore.JobFilter{Statuses: []string{pgstore.StatusFailed},
		FailedSince: pgstore.TimeBound{Ago: 2 * time.Hour}, Limit: 10})
	requireNoErr(t, err)
	if sel.Matched != 3 || !slices.Equal(sel.IDs, []string{"F1", "F2", "F3"}) {
		t.Fatalf("failed in the last 2h = %+v, want F1, F2, F3 oldest first", sel)
	}
	sel, err = store.daemon.SelectJobs(ctx, pgstore.JobFilter{Statuses: []string{pgstore.StatusFailed},
		FailedSince: pgstore.TimeBound{Ago: 2 * time.Hour}, FailedUntil: pgstore.TimeBound{Ago: 15 * time.Minute},
		Failures: []string{"stalled", "lost_task"}, Queues: []string{"default"}, Limit: 10})
	requireNoErr(t, err)
	if sel.Matched != 1 || !slices.Equal(sel.IDs, []string{"F2"}) {
		t.Fatalf("narrowed = %+v, want F2", sel)
	}
	sel, err = store.daemon.SelectJobs(ctx, pgstore.JobFilter{Statuses: []string{pgstore.StatusFailed},
		FailedSince: pgstore.TimeBound{At: time.Now().Add(-24 * time.Hour)}, Types: []string{"report.export"}, Limit: 2})
	requireNoErr(t, err)
	if sel.Matched != 4 || !slices.Equal(sel.IDs, []string{"F4", "F1"}) {
		t.Fatalf("limit 2 of 4 = %+v, want F4, F1 and 4 matched", sel)
	}
	for name, f := range map[string]pgstore.JobFilter{
		"LimitZero":       {Statuses: []string{pgstore.StatusFailed}, FailedSince: pgstore.TimeBound{Ago: time.Hour}},
		"LimitTooHigh":    {Statuses: []string{pgstore.StatusFailed}, FailedSince: pgstore.TimeBound{Ago: time.Hour}, Limit: pgstore.BulkLimitMax + 1},
		"NoTimeBound":     {Statuses: []string{pgstore.StatusFailed}, Limit: 5},
		"NoStatus":        {FailedSince: pgstore.TimeBound{Ago: time.Hour}, Limit: 5},
		"NegativeAgoOnly": {Statuses: []string{pgstore.StatusFailed}, CreatedSince: pgstore.TimeBound{Ago: -time.Hour}, Limit: 5},
	} {
		if _, err := store.daemon.SelectJobs(ctx, f); err == nil {
			t.Errorf("%s: no error", name)
		} else {
			requireIs(t, err, pgcore.ErrInvalidArgument)
		}
	}
}
