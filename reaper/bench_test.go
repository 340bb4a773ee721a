package reaper_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/jobreaper/jobreaper/internal/asynqstate"
	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
	"github.com/jobreaper/jobreaper/reaper"
)

// BenchmarkDecide measures the pure decision for one job past its limit.
func BenchmarkDecide(b *testing.B) {
	now := time.Now()
	started, stall := now.Add(-31*time.Minute), 20*time.Minute
	snap := &jobs.Snapshot{ID: "J", Type: "report.export", Status: jobs.StatusProcessing, Generation: 1,
		StartedAt: &started, UpdatedAt: now.Add(-21 * time.Minute),
		Limits: &jobs.Limits{MaxRuntime: 30 * time.Minute, StallTimeout: &stall}}
	b.ReportAllocs()
	for b.Loop() {
		if v := reaper.Decide(snap, now, baselineRule); !v.Reap {
			b.Fatal("not reaped")
		}
	}
}

// BenchmarkRunOnce measures a steady-state pass over n active tasks whose
// jobs are all healthy (within their limit): the database clock, one
// batched load of n rows with their limits, and n decisions. Nothing is
// written, as in most passes. ns/task is the cost per active task.
func BenchmarkRunOnce(b *testing.B) {
	for _, n := range []int{1000, 10000} {
		b.Run(fmt.Sprintf("tasks=%d", n), func(b *testing.B) {
			db := jobstest.New(b)
			db.JobType(b, "report.export", "30 minutes", "", "")
			db.Exec(b, `INSERT INTO jobs (id, type, status, generation, queue, started_at, updated_at)
SELECT 'job-' || i, 'report.export', 'PROCESSING', 1, 'default', now(), now()
  FROM generate_series(1, $1) AS i`, n)
			ids := make([]string, n)
			for i := range ids {
				ids[i] = fmt.Sprintf("job-%d", i+1)
			}
			mr := miniredis.RunT(b)
			rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
			b.Cleanup(func() { _ = rdb.Close() })
			markers := newMarkers(b, rdb)
			lister := &fakeLister{queues: map[string]asynqstate.ActiveTasks{"default": {IDs: ids}}}
			r := reaper.New(db.Daemon(), lister, markers, reaper.Options{Rule: baselineRule})
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				res, err := r.RunOnce(ctx)
				if err != nil || res.Scanned != n || res.Skipped["within_limit"] != n {
					b.Fatalf("result = %+v, err = %v", res, err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(n), "ns/task")
		})
	}
}
