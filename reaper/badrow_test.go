package reaper_test

import (
	"context"
	"testing"
	"time"

	"github.com/jobreaper/jobreaper/internal/asynqstate"
	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/reaper"
)

// A row Go cannot read whole (a timestamp of 'infinity', which the
// product's own SQL can write) is one bad item: it is counted as bad_row
// and the rows read with it are still judged and reaped, on the active
// path and on the lost-task path alike.
func TestRowThatCannotBeReadIsSkippedAndTheOthersAreReaped(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	for _, tc := range []struct{ name, set string }{
		{"UpdatedAtInfinity", `updated_at = 'infinity'`},
		{"UpdatedAtMinusInfinity", `updated_at = '-infinity'`},
		{"StartedAtMinusInfinity", `started_at = '-infinity'`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			// J-bad sorts between the two stalled jobs of the same batch.
			for _, id := range []string{"J-a", "J-bad", "J-c", "L-bad", "L-d"} {
				b.stalled(t, id)
			}
			b.db.Exec(t, `UPDATE jobs SET `+tc.set+` WHERE id IN ('J-bad', 'L-bad')`)
			badBefore := rawRow(t, b, "J-bad")
			// J-* are active; L-* are not, and asynq has no task for them.
			b.lister.queues["default"] = asynqstate.ActiveTasks{IDs: []string{"J-a", "J-bad", "J-c"}}

			res, err := runOnce(t, ctx, b.reaper)
			if err != nil {
				t.Fatal(err)
			}
			// J-bad is counted on the active path, L-bad on the lost-task
			// path, which reads rows idle for at least the minimum stall
			// timeout: an updated_at of +infinity is never idle, so
			// L-bad is not looked at there.
			wantBad := 2
			if tc.set == `updated_at = 'infinity'` {
				wantBad = 1
			}
			if res.Errors != 0 || res.Reaped != 3 || res.ReapedBy["stalled"] != 2 || res.ReapedBy["lost_task"] != 1 ||
				res.Skipped["bad_row"] != wantBad {
				t.Fatalf("result = %+v, want 0 errors, J-a and J-c stalled, L-d lost_task, %d bad_row", res, wantBad)
			}
			for id, reason := range map[string]string{"J-a": "stalled", "J-c": "stalled", "L-d": "lost_task"} {
				if row := b.db.Read(t, id); row.Status != jobs.StatusFailed || row.FailureReason != reason {
					t.Fatalf("%s = %+v, want FAILED %s", id, row, reason)
				}
			}
			for _, id := range []string{"J-bad", "L-bad"} {
				if row := rawRow(t, b, id); row.status != jobs.StatusProcessing || row.reason != "" {
					t.Fatalf("%s = %+v, want it left PROCESSING", id, row)
				}
				if b.redis.Exists("jobreaper:reaped:" + id) {
					t.Fatalf("%s got a marker", id)
				}
			}
			if got := rawRow(t, b, "J-bad"); got != badBefore {
				t.Fatalf("J-bad changed: %+v -> %+v", badBefore, got)
			}
			if got := metricValue(t, b.reg, "jobreaper_jobs_skipped_total", map[string]string{"reason": "bad_row"}); got != float64(wantBad) {
				t.Fatalf("jobreaper_jobs_skipped_total{reason=bad_row} = %v, want %d", got, wantBad)
			}
		})
	}
}

// The boundary of the shared rule: an unreadable row is never reaped by
// Decide, whatever the rest of it says.
func TestDecideSkipsAnUnreadableRow(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 11, 30, 9, 31, 0, 0, time.UTC)
	started := now.Add(-31 * time.Minute)
	snap := &jobs.Snapshot{ID: "J", Type: "report.export", Status: jobs.StatusProcessing, Generation: 1,
		StartedAt: &started, Unreadable: "updated_at is -infinity",
		Limits: &jobs.Limits{MaxRuntime: 30 * time.Minute}}
	v := reaper.Decide(snap, now, baselineRule)
	if v.Reap || v.Skip != "bad_row" || v.Why != "updated_at is -infinity" {
		t.Fatalf("verdict = %+v, want skip bad_row naming the value", v)
	}
	snap.Status = jobs.StatusCompleted
	if v := reaper.Decide(snap, now, baselineRule); v.Skip != "not_processing" {
		t.Fatalf("verdict for a COMPLETED row = %+v, want not_processing", v)
	}
}

// row is a job row read as text, infinite timestamps included.
type row struct{ status, reason, startedAt, updatedAt string }

func rawRow(t *testing.T, b *bundle, id string) row {
	t.Helper()
	var r row
	err := b.db.Pool.QueryRow(context.Background(), `SELECT status, coalesce(failure_reason, ''), started_at::text, updated_at::text
  FROM jobs WHERE id = $1`, id).Scan(&r.status, &r.reason, &r.startedAt, &r.updatedAt)
	if err != nil {
		t.Fatalf("reading job %s: %v", id, err)
	}
	return r
}
