package pgstore_test

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/jobreaper/jobreaper/internal/pgstore"
	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
)

// ListLeaderLeases returns every row, live or expired, with the database
// clock of the read, and the clock alone when the table is empty.
func TestListLeaderLeases(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, store := setup(t, nil)

	empty, err := store.ListLeaderLeases(ctx)
	requireNoErr(t, err)
	if len(empty.Rows) != 0 || time.Since(empty.Now).Abs() > time.Minute {
		t.Fatalf("empty table: %+v, want no rows and the database clock", empty)
	}

	a, b := pgstore.NewLeaderLeaseHolder(time.Now()), pgstore.NewLeaderLeaseHolder(time.Now())
	keyA, keyB := pgstore.LeaderLeaseKey([]string{"qa"}), pgstore.LeaderLeaseKey(nil)
	for _, p := range []pgstore.LeaderLeaseParams{{Key: keyA, Holder: a, TTL: time.Hour}, {Key: keyB, Holder: b, TTL: time.Hour}} {
		_, err := store.AcquireLeaderLease(ctx, p)
		requireNoErr(t, err)
	}
	db.Exec(t, `UPDATE leader_leases SET expires_at = now() - interval '1 second' WHERE key = $1`, keyB)
	got, err := store.ListLeaderLeases(ctx)
	requireNoErr(t, err)
	byKey := map[string]pgstore.LeaderLeaseRow{}
	for _, r := range got.Rows {
		byKey[r.Key] = r
	}
	if len(got.Rows) != 2 || byKey[keyA].HolderID != a.ID || byKey[keyB].HolderID != b.ID {
		t.Fatalf("rows %+v, want %s held by %s and %s by %s", got.Rows, keyA, a.ID, keyB, b.ID)
	}
	if !byKey[keyA].ExpiresAt.After(got.Now) || byKey[keyB].ExpiresAt.After(got.Now) {
		t.Fatalf("at %s: %s expires %s (want after), %s expires %s (want before)", got.Now,
			keyA, byKey[keyA].ExpiresAt, keyB, byKey[keyB].ExpiresAt)
	}
}

// CountStalledByQueue counts, per named queue, the PROCESSING rows the
// stall rule calls stalled: not those within their limits, of another
// queue, of another status, of a type whose limits are unsafe, nor those
// whose timestamps are infinite.
func TestCountStalledByQueue(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, store := setup(t, nil)
	db.JobType(t, "unsafe.limits", "30 minutes", "1 minute", "") // stall timeout under the minimum: bad_limits
	stalled := func(id, q, typ string) jobstest.Job {
		return jobstest.Job{ID: id, Type: typ, Generation: 1, Queue: q, StartedAgo: jobstest.Ago(31 * time.Minute), IdleAgo: 21 * time.Minute}
	}
	for _, j := range []jobstest.Job{
		stalled("c1", "c", "report.export"), stalled("c2", "c", "report.export"), stalled("d1", "d", "crawl.site"),
		// Within the limits: 31 minutes into a 60-minute type, or idle 5 minutes.
		stalled("d2", "d", "crawl.site"),
		stalled("e1", "e", "report.export"), // a queue not asked for
		stalled("c3", "c", "unsafe.limits"),
		{ID: "c4", Type: "report.export", Generation: 1, Queue: "c", StartedAgo: jobstest.Ago(31 * time.Minute), IdleAgo: 5 * time.Minute},
		{ID: "c5", Type: "report.export", Status: jobs.StatusQueued, Queue: "c", IdleAgo: 21 * time.Minute},
	} {
		db.Insert(t, j)
	}
	db.Exec(t, `UPDATE jobs SET started_at = now() - interval '3 hours' WHERE id = 'd1'`)
	db.Exec(t, `INSERT INTO jobs (id, type, status, generation, queue, started_at, updated_at)
VALUES ('c6', 'report.export', 'PROCESSING', 1, 'c', '-infinity', '-infinity')`)

	got, err := store.CountStalledByQueue(ctx, []string{"c", "d", "f"}, rule)
	requireNoErr(t, err)
	if want := map[string]int{"c": 2, "d": 1}; !maps.Equal(got, want) {
		t.Fatalf("CountStalledByQueue = %v, want %v", got, want)
	}
	none, err := store.CountStalledByQueue(ctx, nil, rule)
	requireNoErr(t, err)
	if len(none) != 0 {
		t.Fatalf("no queues: %v, want none", none)
	}
}

// TestUncoveredCountPlanUsesTheProcessingIndex checks, on EXPLAIN over the
// stale statistics of TestPlansHoldOnStaleStatistics, that the
// uncovered-queue check's count reads jobs through the partial index the
// lost-task search uses, and nothing else, without a parallel plan or a
// nested loop.
func TestUncoveredCountPlanUsesTheProcessingIndex(t *testing.T) {
	t.Parallel()
	for _, analyzedEmpty := range []bool{false, true} {
		t.Run(fmt.Sprintf("AnalyzedEmpty=%v", analyzedEmpty), func(t *testing.T) {
			t.Parallel()
			db, store := setup(t, nil)
			jobstest.StaleTable(t, db, analyzedEmpty)
			for _, queues := range [][]string{{"q3"}, {"q0", "q1", "q2", "q3", "q4", "q5", "q6", "q7", "q8", "q9"}} {
				args := pgx.NamedArgs(rule.Args())
				args["queues"] = queues
				plan, text := jobstest.Explain(t, db, store.Q(pgstore.StalledByQueueSQL), args)
				var access []string
				var gather bool
				jobstest.JobsAccess(plan, &access, &gather)
				if !slices.Equal(access, []string{"jobs_processing_queue_idx"}) || gather {
					t.Errorf("the count over %d queue(s) reads jobs by %v (gather or nested loop %v), want jobs_processing_queue_idx only:\n%s",
						len(queues), access, gather, text)
				}
			}
			// And the count is right on that table: one row in 20 of the
			// PROCESSING rows left is idle 30 minutes, all in q0: 750.
			got, err := store.CountStalledByQueue(context.Background(), []string{"q0", "q5"}, rule)
			requireNoErr(t, err)
			if want := map[string]int{"q0": 750}; !maps.Equal(got, want) {
				t.Fatalf("CountStalledByQueue = %v, want %v", got, want)
			}
		})
	}
}
