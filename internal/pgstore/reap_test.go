package pgstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/jobreaper/jobreaper/internal/pgstore"
	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
)

var baselineRule = pgstore.StallRule{
	DefaultStallTimeout: 15 * time.Minute,
	MinStallTimeout:     11 * time.Minute, // 2 x 5m heartbeat + 1m interval
	DefaultHardTimeout:  jobs.HardTimeoutDefault,
}

// stalledJob inserts a report.export job (30 min limit) that started 31
// minutes ago and has not moved for 21, and returns it as read.
func stalledJob(t *testing.T, db *jobstest.DB, id string) (*testStore, jobs.Snapshot) {
	t.Helper()
	db.JobType(t, "report.export", "30 minutes", "", "")
	db.Insert(t, jobstest.Job{ID: id, Type: "report.export", Generation: 1, Worker: "w1",
		StartedAgo: jobstest.Ago(31 * time.Minute), IdleAgo: 21 * time.Minute})
	store := stores(db, nil)
	snap, err := store.Get(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return store, snap
}

func reapParams(snap jobs.Snapshot) pgstore.ReapParams {
	return pgstore.ReapParams{JobID: snap.ID, Generation: snap.Generation, UpdatedAt: snap.UpdatedAt,
		Reason: jobs.ReasonStalled, Rule: baselineRule}
}

func TestReap(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("ReapsStalledJobWithEvidence", func(t *testing.T) {
		t.Parallel()
		db := jobstest.New(t)
		store, snap := stalledJob(t, db, "J5")
		reaped, ev, err := store.Reap(ctx, reapParams(snap))
		if err != nil || !reaped {
			t.Fatalf("reaped = %v, err = %v", reaped, err)
		}
		row := db.Read(t, "J5")
		if row.Status != jobs.StatusFailed || row.FailureReason != "stalled" || row.Generation != 1 {
			t.Fatalf("row = %+v", row)
		}
		if !row.UpdatedAt.Equal(snap.UpdatedAt) {
			t.Fatalf("updated_at moved from %v to %v; a reap is not progress", snap.UpdatedAt, row.UpdatedAt)
		}
		if ev.Generation != 1 || ev.Worker != "w1" || ev.MaxRuntime != 30*time.Minute || ev.StallTimeout != 15*time.Minute {
			t.Fatalf("evidence = %+v", ev)
		}
		if ev.Runtime < 31*time.Minute || ev.Runtime > 32*time.Minute || ev.Idle < 21*time.Minute || ev.Idle > 22*time.Minute {
			t.Fatalf("evidence runtime %v idle %v", ev.Runtime, ev.Idle)
		}
		if n := db.Events(t, "J5", "reaped"); n != 1 {
			t.Fatalf("reaped events = %d, want 1", n)
		}
		var runtimeSeconds float64
		var gen int64
		if err := db.Pool.QueryRow(ctx, `SELECT (detail->>'runtime_seconds')::float8, generation
  FROM job_events WHERE job_id = 'J5' AND kind = 'reaped'`).Scan(&runtimeSeconds, &gen); err != nil {
			t.Fatal(err)
		}
		if runtimeSeconds < 31*60 || gen != 1 {
			t.Fatalf("event runtime_seconds = %v generation = %d", runtimeSeconds, gen)
		}
	})

	// Each change below happens between the read and the reap; the CAS must
	// then change 0 rows and write nothing else.
	for _, tc := range []struct {
		name, change string
		wantStatus   string
	}{
		{"ChangesNothingWhenUpdatedAtMoved", `UPDATE jobs SET updated_at = now() WHERE id = 'J'`, jobs.StatusProcessing},
		{"ChangesNothingWhenGenerationChanged", `UPDATE jobs SET generation = 2 WHERE id = 'J'`, jobs.StatusProcessing},
		{"ChangesNothingWhenJobCompleted", `UPDATE jobs SET status = 'COMPLETED' WHERE id = 'J'`, jobs.StatusCompleted},
		{"ChangesNothingWhenMaxRuntimeRaised", `UPDATE job_types SET max_runtime = '2 hours' WHERE name = 'report.export'`, jobs.StatusProcessing},
		{"ChangesNothingWhenStallTimeoutRaised", `UPDATE job_types SET stall_timeout = '1 hour' WHERE name = 'report.export'`, jobs.StatusProcessing},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			db := jobstest.New(t)
			store, snap := stalledJob(t, db, "J")
			db.Exec(t, tc.change)
			reaped, _, err := store.Reap(ctx, reapParams(snap))
			if err != nil || reaped {
				t.Fatalf("reaped = %v, err = %v; want false, nil", reaped, err)
			}
			row := db.Read(t, "J")
			if row.Status != tc.wantStatus || row.FailureReason != "" {
				t.Fatalf("row = %+v, want status %s and no failure reason", row, tc.wantStatus)
			}
			if n := db.Events(t, "J", "reaped"); n != 0 {
				t.Fatalf("reaped events = %d, want 0", n)
			}
		})
	}
}
