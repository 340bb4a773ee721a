package jobs_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
)

func requireItems(t *testing.T, db *jobstest.DB, id string, want int64) {
	t.Helper()
	requireCount(t, db, want, `SELECT count(*) FROM items WHERE job_id = $1`, id)
	requireCount(t, db, want, `SELECT count(DISTINCT n) FROM items WHERE job_id = $1`, id)
}

func requireBatches(t *testing.T, db *jobstest.DB, id string, want int64) {
	t.Helper()
	requireCount(t, db, want, `SELECT count(*) FROM job_batches WHERE job_id = $1`, id)
}

func TestAdvance(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	// start returns a schema with the items table and job j1 of total 4,
	// claimed by w1 (generation 1).
	start := func(t *testing.T) (*jobstest.DB, *jobs.Store, jobs.Lease) {
		db, store := setup(t, nil)
		db.Exec(t, jobstest.ItemsTable)
		lease := queued(t, db, store, jobstest.Job{ID: "j1", Type: "crawl.site", Total: ptr[int64](4)}, "w1")
		return db, store, lease
	}

	t.Run("NewBatchMovesCursorAndUpdatedAtWithItsRows", func(t *testing.T) {
		t.Parallel()
		db, store, lease := start(t)
		backdate(t, db, "j1", time.Hour, 10*time.Minute)
		before := db.Read(t, "j1").UpdatedAt
		res, err := jobstest.Batch(ctx, store, db, lease, "b1", 0, 3)
		requireNoErr(t, err)
		if res.Cursor != 3 || res.Replayed || res.Generation != 1 {
			t.Fatalf("result = %+v", res)
		}
		if r := requireRow(t, db, "j1", jobs.StatusProcessing, 1, 3); !r.UpdatedAt.After(before.Add(9 * time.Minute)) {
			t.Fatalf("updated_at %v did not move to now (was %v)", r.UpdatedAt, before)
		}
		requireBatches(t, db, "j1", 1)
		requireItems(t, db, "j1", 3)
	})

	t.Run("EveryRefusedBatchLeavesCursorBatchesAndRowsAsTheyWere", func(t *testing.T) {
		t.Parallel()
		db, store, lease := start(t)
		_, err := jobstest.Batch(ctx, store, db, lease, "b1", 0, 2)
		requireNoErr(t, err)
		for _, tc := range []struct {
			token       string
			from, count int64
			want        error
			code        string
		}{
			{"b1", 0, 3, jobs.ErrTokenConflict, "token_conflict"},
			{"b1", 1, 2, jobs.ErrTokenConflict, "token_conflict"},
			{"b2", 0, 1, jobs.ErrCursorMismatch, "cursor_mismatch"},
			{"b2", 3, 1, jobs.ErrCursorMismatch, "cursor_mismatch"},
			{"b2", 2, 3, jobs.ErrOutOfRange, "out_of_range"},
			{"", 2, 1, jobs.ErrInvalidArgument, ""},
			{"b2", 2, 0, jobs.ErrInvalidArgument, ""},
		} {
			_, err := jobstest.Batch(ctx, store, db, lease, tc.token, tc.from, tc.count)
			requireIs(t, err, tc.want)
			if got := jobs.ErrorCode(err); got != tc.code {
				t.Fatalf("code of %v = %q, want %q", err, got, tc.code)
			}
			requireRow(t, db, "j1", jobs.StatusProcessing, 1, 2)
			requireBatches(t, db, "j1", 1)
			requireItems(t, db, "j1", 2)
		}
		requireLate(t, db, "j1") // none of these is a late result
		missing := lease
		missing.JobID = "missing"
		_, err = jobstest.Batch(ctx, store, db, missing, "b2", 2, 1)
		requireIs(t, err, jobs.ErrNotFound)
		requireBatches(t, db, "missing", 0)
	})

	t.Run("RecordedTokenWithTheSameContentReplaysTheStoredCursor", func(t *testing.T) {
		t.Parallel()
		db, store, lease := start(t)
		_, err := jobstest.Batch(ctx, store, db, lease, "b1", 0, 2)
		requireNoErr(t, err)
		_, err = jobstest.Batch(ctx, store, db, lease, "b2", 2, 1)
		requireNoErr(t, err)
		res, err := jobstest.Batch(ctx, store, db, lease, "b1", 0, 2)
		requireNoErr(t, err)
		if !res.Replayed || res.Cursor != 2 || res.Generation != 1 {
			t.Fatalf("replay = %+v, want cursor 2 replayed by generation 1", res)
		}
		requireRow(t, db, "j1", jobs.StatusProcessing, 1, 3)
		requireBatches(t, db, "j1", 2)
		requireItems(t, db, "j1", 3)
	})

	t.Run("StaleGenerationIsRefusedEvenForARecordedToken", func(t *testing.T) {
		t.Parallel()
		db, store, old := start(t)
		_, err := jobstest.Batch(ctx, store, db, old, "b1", 0, 1)
		requireNoErr(t, err)
		claim(t, store, "j1", 1, "w2")
		for _, tc := range []struct {
			token       string
			from, count int64
		}{{"b1", 0, 1}, {"b2", 1, 1}} {
			_, err := jobstest.Batch(ctx, store, db, old, tc.token, tc.from, tc.count)
			requireIs(t, err, jobs.ErrStaleWorker)
		}
		requireRow(t, db, "j1", jobs.StatusProcessing, 2, 1)
		requireBatches(t, db, "j1", 1)
		requireItems(t, db, "j1", 1)
		requireLate(t, db, "j1", [2]string{"Advance", "stale_worker"}, [2]string{"Advance", "stale_worker"})
	})

	t.Run("TerminalJobRefusesNewBatchesButReplaysRecordedOnes", func(t *testing.T) {
		t.Parallel()
		db, store, lease := start(t)
		_, err := jobstest.Batch(ctx, store, db, lease, "b1", 0, 2)
		requireNoErr(t, err)
		backdate(t, db, "j1", 2*time.Hour, time.Hour)
		if !reap(t, store, "j1") {
			t.Fatal("not reaped")
		}
		_, err = jobstest.Batch(ctx, store, db, lease, "b2", 2, 1)
		requireIs(t, err, jobs.ErrJobTerminal)
		res, err := jobstest.Batch(ctx, store, db, lease, "b1", 0, 2)
		requireNoErr(t, err)
		if !res.Replayed || res.Cursor != 2 {
			t.Fatalf("replay on a FAILED job = %+v", res)
		}
		requireRow(t, db, "j1", jobs.StatusFailed, 1, 2)
		requireBatches(t, db, "j1", 1)
		requireItems(t, db, "j1", 2)
		requireLate(t, db, "j1", [2]string{"Advance", "job_terminal"})
	})

	t.Run("CrashBetweenTheBatchRowsAndTheCommitLeavesNeither", func(t *testing.T) {
		t.Parallel()
		db, store, lease := start(t)
		err := inTx(t, db, func(tx pgx.Tx) error {
			if _, err := store.Advance(ctx, tx, lease, "b1", 0, 2); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, `INSERT INTO items VALUES ('j1', 1, 1), ('j1', 2, 1)`); err != nil {
				return err
			}
			return errors.New("worker crashed")
		})
		if err == nil || err.Error() != "worker crashed" {
			t.Fatalf("err = %v", err)
		}
		requireRow(t, db, "j1", jobs.StatusProcessing, 1, 0)
		requireBatches(t, db, "j1", 0)
		requireItems(t, db, "j1", 0)
	})

	t.Run("FailedAttemptAtCursorTwoOfFourIsResumedByTheNextClaimAndFinishesAtFour", func(t *testing.T) {
		t.Parallel()
		db, store, first := start(t)
		for i := int64(0); i < 2; i++ {
			_, err := jobstest.Batch(ctx, store, db, first, fmt.Sprintf("t%d", i+1), i, 1)
			requireNoErr(t, err)
		}
		requireNoErr(t, store.Release(ctx, first)) // a retryable error
		requireRow(t, db, "j1", jobs.StatusQueued, 1, 2)
		second := claim(t, store, "j1", 1, "w2")
		if second.Generation != 2 || second.Cursor != 2 || second.Total != 4 {
			t.Fatalf("second lease = %+v, want generation 2 at cursor 2 of 4", second)
		}
		for i := int64(0); i < 2; i++ { // tokens 1-2 re-sent by the new generation
			res, err := jobstest.Batch(ctx, store, db, second, fmt.Sprintf("t%d", i+1), i, 1)
			requireNoErr(t, err)
			if !res.Replayed || res.Cursor != i+1 || res.Generation != 1 {
				t.Fatalf("re-sent token t%d = %+v", i+1, res)
			}
		}
		for i := second.Cursor; i < 4; i++ {
			res, err := jobstest.Batch(ctx, store, db, second, fmt.Sprintf("t%d", i+1), i, 1)
			requireNoErr(t, err)
			if res.Replayed || res.Cursor != i+1 {
				t.Fatalf("token t%d = %+v", i+1, res)
			}
		}
		_, err := store.CompleteWith(ctx, db.Pool, second, nil)
		requireNoErr(t, err)
		requireRow(t, db, "j1", jobs.StatusCompleted, 2, 4)
		requireBatches(t, db, "j1", 4)
		requireItems(t, db, "j1", 4)
		requireCount(t, db, 2, `SELECT count(*) FROM items WHERE job_id = 'j1' AND generation = 2`)
	})

	t.Run("ConcurrentAdvancesWithOneTokenRecordItOnce", func(t *testing.T) {
		t.Parallel()
		db, store, lease := start(t)
		const racers = 20
		var (
			wg              sync.WaitGroup
			mu              sync.Mutex
			fresh, replayed int
			gate            = make(chan struct{})
		)
		for range racers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-gate
				res, err := jobstest.Batch(ctx, store, db, lease, "b1", 0, 3)
				mu.Lock()
				defer mu.Unlock()
				switch {
				case err != nil:
					t.Errorf("advance: %v", err)
				case res.Replayed:
					replayed++
				default:
					fresh++
				}
			}()
		}
		close(gate)
		wg.Wait()
		if fresh != 1 || replayed != racers-1 {
			t.Fatalf("fresh = %d, replayed = %d; want 1 and %d", fresh, replayed, racers-1)
		}
		requireRow(t, db, "j1", jobs.StatusProcessing, 1, 3)
		requireBatches(t, db, "j1", 1)
		requireItems(t, db, "j1", 3)
	})
}

func TestSetTotal(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("TotalGrowsAndMayNotGoBelowTheCursor", func(t *testing.T) {
		t.Parallel()
		db, store := setup(t, nil)
		db.Exec(t, jobstest.ItemsTable)
		lease := queued(t, db, store, jobstest.Job{ID: "j1", Type: "crawl.site", Total: ptr[int64](4)}, "w1")
		_, err := jobstest.Batch(ctx, store, db, lease, "b1", 0, 4)
		requireNoErr(t, err)
		requireNoErr(t, store.SetTotal(ctx, lease, 10))
		_, err = jobstest.Batch(ctx, store, db, lease, "b2", 4, 6)
		requireNoErr(t, err)
		err = store.SetTotal(ctx, lease, 9)
		requireIs(t, err, jobs.ErrOutOfRange)
		requireIs(t, store.SetTotal(ctx, lease, -1), jobs.ErrInvalidArgument)
		if r := requireRow(t, db, "j1", jobs.StatusProcessing, 1, 10); r.Total != 10 {
			t.Fatalf("total = %d, want 10", r.Total)
		}
	})

	t.Run("SetTotalOfAnOldGenerationIsStale", func(t *testing.T) {
		t.Parallel()
		db, store := setup(t, nil)
		old := queued(t, db, store, jobstest.Job{ID: "j1", Type: "crawl.site", Total: ptr[int64](4)}, "w1")
		claim(t, store, "j1", 1, "w2")
		requireIs(t, store.SetTotal(ctx, old, 100), jobs.ErrStaleWorker)
		if r := requireRow(t, db, "j1", jobs.StatusProcessing, 2, 0); r.Total != 4 {
			t.Fatalf("total = %d, want 4", r.Total)
		}
		requireLate(t, db, "j1", [2]string{"SetTotal", "stale_worker"})
	})
}
