package jobs_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
)

// blip cuts cut now and restores it after d, on the host clock: the
// retries under test wait on real timers.
func blip(t *testing.T, cut *jobstest.Cuttable, d time.Duration) {
	t.Helper()
	cut.Cut()
	restore := time.AfterFunc(d, cut.Restore)
	t.Cleanup(func() { restore.Stop() })
}

// finalSetup returns a schema with the recording cascades and a products
// table, a claimed report.export job j1, the Store of the test's own pool
// (for reads and setup) and a Store over a pool the test can cut.
func finalSetup(t *testing.T) (*jobstest.DB, *jobstest.Cuttable, *jobs.Store, jobs.Lease) {
	t.Helper()
	db, store := setup(t, recordingCascades)
	db.Exec(t, hookTable)
	db.Exec(t, `CREATE TABLE products (job_id text NOT NULL)`)
	db.Exec(t, `UPDATE job_types SET auto_complete = true WHERE name = 'report.export'`)
	lease := queued(t, db, store, jobstest.Job{ID: "j1", Type: "report.export"}, "w1")
	cut := db.Cuttable(t)
	return db, cut, jobs.NewStore(cut.Pool, jobs.WithSchema(db.Schema), jobs.WithCascades(recordingCascades)), lease
}

// TestFinalizationSurvivesABlip: Fail, Release, AutoComplete and
// CompleteWith meet a connection that is refused for one second. Each
// retries with its backoff (0.25, 0.5, 1 s: the third retry comes after
// the blip) and ends as asked, with its event and cascade written once
// and no late_result_rejected event.
func TestFinalizationSurvivesABlip(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("FailIsRetriedUntilItIsWritten", func(t *testing.T) {
		t.Parallel()
		db, cut, store, lease := finalSetup(t)
		blip(t, cut, time.Second)
		requireNoErr(t, store.Fail(ctx, lease, "upstream_down"))
		if r := requireRow(t, db, "j1", jobs.StatusFailed, 1, 0); r.FailureReason != "upstream_down" {
			t.Fatalf("failure reason = %q, want upstream_down", r.FailureReason)
		}
		requireHooks(t, db, "j1", "on_failed", 1)
		requireLate(t, db, "j1")
		if cut.Refused() < 2 {
			t.Fatalf("%d connections refused, want the blip to have refused the first tries", cut.Refused())
		}
	})

	t.Run("ReleaseIsRetriedUntilItIsWritten", func(t *testing.T) {
		t.Parallel()
		db, cut, store, lease := finalSetup(t)
		blip(t, cut, time.Second)
		requireNoErr(t, store.Release(ctx, lease))
		requireRow(t, db, "j1", jobs.StatusQueued, 1, 0)
		if n := db.Events(t, "j1", jobs.EventReleased); n != 1 {
			t.Fatalf("released events = %d, want 1", n)
		}
		requireLate(t, db, "j1")
	})

	t.Run("AutoCompleteIsRetriedUntilItIsWritten", func(t *testing.T) {
		t.Parallel()
		db, cut, store, lease := finalSetup(t)
		blip(t, cut, time.Second)
		res, err := store.AutoComplete(ctx, lease)
		requireNoErr(t, err)
		if !res.Confirmed || res.Replayed {
			t.Fatalf("result = %+v, want confirmed", res)
		}
		requireRow(t, db, "j1", jobs.StatusCompleted, 1, 0)
		requireHooks(t, db, "j1", "on_completed", 1)
		requireLate(t, db, "j1")
	})

	t.Run("CompleteWithIsRetriedWhileItsTransactionCannotBeginAndRunsFnOnce", func(t *testing.T) {
		t.Parallel()
		db, cut, store, lease := finalSetup(t)
		blip(t, cut, time.Second)
		var calls atomic.Int32
		res, err := store.CompleteWith(ctx, nil, lease, func(tx pgx.Tx) error {
			calls.Add(1)
			_, err := tx.Exec(ctx, `INSERT INTO products VALUES ('j1')`)
			return err
		})
		requireNoErr(t, err)
		if !res.Confirmed || res.Replayed || calls.Load() != 1 {
			t.Fatalf("result = %+v after %d calls of fn, want confirmed after 1", res, calls.Load())
		}
		requireRow(t, db, "j1", jobs.StatusCompleted, 1, 0)
		requireHooks(t, db, "j1", "on_completed", 1)
		requireCount(t, db, 1, `SELECT count(*) FROM products`)
	})

}

// TestFinalizationRetryLimits: what is not retried, and when the retries
// end.
func TestFinalizationRetryLimits(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("AFailureAfterFnRanIsReturnedWithoutARetry", func(t *testing.T) {
		t.Parallel()
		db, _, store, lease := finalSetup(t)
		var calls atomic.Int32
		_, err := store.CompleteWith(ctx, nil, lease, func(tx pgx.Tx) error {
			calls.Add(1)
			// The connection dies under fn: a connection-level error
			// after the caller's writes began.
			_, err := tx.Exec(ctx, `SELECT pg_terminate_backend(pg_backend_pid())`)
			return err
		})
		if err == nil || calls.Load() != 1 {
			t.Fatalf("CompleteWith = %v after %d calls of fn, want fn's error after exactly 1", err, calls.Load())
		}
		requireRow(t, db, "j1", jobs.StatusProcessing, 1, 0)
		requireCount(t, db, 0, `SELECT count(*) FROM products`)
	})

	t.Run("ARefusalIsNotRetried", func(t *testing.T) {
		t.Parallel()
		db, cut, store, lease := finalSetup(t)
		claim(t, db.Store(), "j1", 1, "w2")
		start := time.Now()
		requireIs(t, store.Fail(ctx, lease, "upstream_down"), jobs.ErrStaleWorker)
		if el := time.Since(start); el > 2*time.Second {
			t.Fatalf("a refused Fail took %s, want no retry", el)
		}
		requireLate(t, db, "j1", [2]string{"Fail", "stale_worker"})
		if cut.Refused() != 0 {
			t.Fatal("connections refused without a cut")
		}
	})

	t.Run("AnOutageLongerThanTheRetriesIsReturnedAfterSixTries", func(t *testing.T) {
		t.Parallel()
		db, cut, store, lease := finalSetup(t)
		cut.Cut()
		start := time.Now()
		err := store.Fail(ctx, lease, "upstream_down")
		elapsed := time.Since(start)
		if err == nil || errors.Is(err, jobs.ErrStaleWorker) || errors.Is(err, jobs.ErrJobTerminal) {
			t.Fatalf("Fail through a cut pool = %v, want a connection error", err)
		}
		// 0.25 + 0.5 + 1 + 2 + 4 s between six tries.
		if elapsed < 7750*time.Millisecond || elapsed > 60*time.Second {
			t.Fatalf("Fail gave up after %s, want the 7.75 s of backoff", elapsed)
		}
		if n := cut.Refused(); n != 6 {
			t.Fatalf("%d connections refused, want 6 (one per try)", n)
		}
		requireRow(t, db, "j1", jobs.StatusProcessing, 1, 0)
	})

	t.Run("TheCallersContextEndsTheRetries", func(t *testing.T) {
		t.Parallel()
		db, cut, store, lease := finalSetup(t)
		cut.Cut()
		for name, call := range map[string]func(context.Context) error{
			"Fail":         func(ctx context.Context) error { return store.Fail(ctx, lease, "upstream_down") },
			"Release":      func(ctx context.Context) error { return store.Release(ctx, lease) },
			"AutoComplete": func(ctx context.Context) error { _, err := store.AutoComplete(ctx, lease); return err },
			"CompleteWith": func(ctx context.Context) error {
				_, err := store.CompleteWith(ctx, nil, lease, func(pgx.Tx) error { t.Error("fn ran"); return nil })
				return err
			},
		} {
			cctx, cancel := context.WithTimeout(ctx, 600*time.Millisecond)
			start := time.Now()
			err := call(cctx)
			cancel()
			if err == nil {
				t.Fatalf("%s through a cut pool succeeded", name)
			}
			if el := time.Since(start); el > 3*time.Second {
				t.Fatalf("%s went on for %s after its context ended", name, el)
			}
		}
		requireRow(t, db, "j1", jobs.StatusProcessing, 1, 0)
	})
}

// TestFinalizationAfterALostCommitAnswer: the COMMIT of a finalization
// reaches PostgreSQL and commits, but its answer is lost with the
// connection. The retry finds the job as this very write left it and
// answers success, without a late_result_rejected event and without
// running the cascade twice.
func TestFinalizationAfterALostCommitAnswer(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("Fail", func(t *testing.T) {
		t.Parallel()
		db, cut, store, lease := finalSetup(t)
		cut.LoseNextCommitAnswer()
		requireNoErr(t, store.Fail(ctx, lease, "upstream_down"))
		if r := requireRow(t, db, "j1", jobs.StatusFailed, 1, 0); r.FailureReason != "upstream_down" {
			t.Fatalf("failure reason = %q", r.FailureReason)
		}
		requireHooks(t, db, "j1", "on_failed", 1)
		requireLate(t, db, "j1")
	})

	t.Run("FailAfterAnotherCodeWasStoredIsStillRefused", func(t *testing.T) {
		t.Parallel()
		db, cut, store, lease := finalSetup(t)
		cut.LoseNextCommitAnswer()
		requireNoErr(t, store.Fail(ctx, lease, "upstream_down"))
		requireIs(t, store.Fail(ctx, lease, "other_code"), jobs.ErrJobTerminal)
		requireLate(t, db, "j1", [2]string{"Fail", "job_terminal"})
	})

	t.Run("Release", func(t *testing.T) {
		t.Parallel()
		db, cut, store, lease := finalSetup(t)
		cut.LoseNextCommitAnswer()
		requireNoErr(t, store.Release(ctx, lease))
		requireRow(t, db, "j1", jobs.StatusQueued, 1, 0)
		requireLate(t, db, "j1")
	})

	t.Run("AutoComplete", func(t *testing.T) {
		t.Parallel()
		db, cut, store, lease := finalSetup(t)
		cut.LoseNextCommitAnswer()
		res, err := store.AutoComplete(ctx, lease)
		requireNoErr(t, err)
		if !res.Confirmed {
			t.Fatalf("result = %+v, want confirmed", res)
		}
		requireRow(t, db, "j1", jobs.StatusCompleted, 1, 0)
		requireHooks(t, db, "j1", "on_completed", 1)
		requireLate(t, db, "j1")
	})

	t.Run("CompleteWithStillReportsTheUnknownCommit", func(t *testing.T) {
		t.Parallel()
		db, cut, store, lease := finalSetup(t)
		cut.LoseNextCommitAnswer()
		_, err := store.CompleteWith(ctx, nil, lease, nil)
		requireIs(t, err, jobs.ErrCommitUnknown)
		res, err := store.CompleteWith(ctx, nil, lease, nil)
		requireNoErr(t, err)
		if !res.Replayed || !res.Confirmed {
			t.Fatalf("retried CompleteWith = %+v, want replayed", res)
		}
		requireRow(t, db, "j1", jobs.StatusCompleted, 1, 0)
	})
}
