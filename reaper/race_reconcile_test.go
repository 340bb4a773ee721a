package reaper_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/queue"
	"github.com/jobreaper/jobreaper/reaper"
)

// Two reapers reconcile the same rows at once, on real PostgreSQL and
// Redis: every lost job is reaped exactly once (one reaped event, one
// lost_task count over both), and every lost marker is restored exactly
// once over both.
func TestTwoReapersReconcileTheSameRowsAtOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	o := newOwnRedis(t)
	serve(t, o.rc, []string{"race"}, func(context.Context, *asynq.Task) error { return nil }, asynq.Config{})
	waitLive(t, o.rc, "race")
	for round := range 3 {
		lost := idsOf(fmt.Sprintf("lost%d", round), 40)
		stalledRows(t, o.db, "race", time.Hour, lost...)
		for _, id := range lost {
			archived(t, o.rc, "race", id)
		}
		marked := idsOf(fmt.Sprintf("marked%d", round), 40)
		o.db.Exec(t, `INSERT INTO jobs (id, type, status, generation, queue, failure_reason, finished_at, marker_set_at)
SELECT id, 'report.export', 'FAILED', 2, 'race', 'stalled', now() - interval '1 hour', now() - interval '1 hour'
  FROM unnest($1::text[]) AS id`, marked)

		var (
			wg      sync.WaitGroup
			results [2]reaper.Result
			errs    [2]error
		)
		for i := range results {
			r := o.lostReaper(t, o.rc, func(opts *reaper.Options) { opts.Once = true })
			wg.Add(1)
			go func() {
				defer wg.Done()
				results[i], errs[i] = runOnce(t, ctx, r)
			}()
		}
		wg.Wait()
		for i, err := range errs {
			if err != nil || results[i].Errors != 0 {
				t.Fatalf("round %d reaper %d: %+v, %v", round, i, results[i], err)
			}
		}
		if got := results[0].ReapedBy["lost_task"] + results[1].ReapedBy["lost_task"]; got != len(lost) {
			t.Fatalf("round %d: %d lost_task reaps over both reapers, want %d", round, got, len(lost))
		}
		if got := results[0].MarkersRestored + results[1].MarkersRestored; got != len(marked) {
			t.Fatalf("round %d: %d markers restored over both reapers, want %d", round, got, len(marked))
		}
		if n := o.db.Count(t, `SELECT count(*) FROM (SELECT job_id FROM job_events WHERE kind = 'reaped' AND job_id = ANY($1)
  GROUP BY job_id HAVING count(*) = 1) AS once`, lost); n != int64(len(lost)) {
			t.Fatalf("round %d: %d lost jobs have exactly one reaped event, want %d", round, n, len(lost))
		}
		for _, id := range marked {
			if g, err := o.rc.Get(ctx, queue.MarkerKey(id)).Result(); err != nil || g != "2" {
				t.Fatalf("marker of %s = %q, %v; want generation 2", id, g, err)
			}
		}
		if n := o.db.Count(t, `SELECT count(*) FROM jobs WHERE id = ANY($1) AND status = 'FAILED' AND failure_reason = $2`,
			lost, jobs.ReasonLostTask); n != int64(len(lost)) {
			t.Fatalf("round %d: %d lost jobs FAILED lost_task, want %d", round, n, len(lost))
		}
	}
}
