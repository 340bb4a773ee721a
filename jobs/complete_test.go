package jobs_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
)

// hookTable records every cascade run; the cascades below write one row
// per run, so a test counts how often a hook ran for a job.
const hookTable = `CREATE TABLE hook_runs (job_id text NOT NULL, hook text NOT NULL, parent_id text, tenant_id text, type text)`

var recordingCascades = jobs.Cascades{
	"report.export": {
		OnFailed:    []string{`INSERT INTO hook_runs VALUES (@job_id, 'on_failed', @parent_id, @tenant_id, @type)`},
		OnCompleted: []string{`INSERT INTO hook_runs VALUES (@job_id, 'on_completed', @parent_id, @tenant_id, @type)`},
	},
}

func requireHooks(t *testing.T, db *jobstest.DB, id, hook string, want int64) {
	t.Helper()
	requireCount(t, db, want, `SELECT count(*) FROM hook_runs WHERE job_id = $1 AND hook = $2`, id, hook)
}

func TestComplete(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	start := func(t *testing.T) (*jobstest.DB, *jobs.Store, jobs.Lease) {
		db, store := setup(t, recordingCascades)
		db.Exec(t, hookTable)
		db.Exec(t, `CREATE TABLE products (job_id text NOT NULL)`)
		lease := queued(t, db, store, jobstest.Job{ID: "j1", Type: "report.export", ParentID: "p1", TenantID: "t1"}, "w1")
		return db, store, lease
	}
	writeProduct := func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO products VALUES ('j1')`)
		return err
	}

	t.Run("CompleteWithCommitsStatusCascadeEventAndProductRowsTogether", func(t *testing.T) {
		t.Parallel()
		db, store, lease := start(t)
		res, err := store.CompleteWith(ctx, db.Pool, lease, writeProduct)
		requireNoErr(t, err)
		if !res.Confirmed || res.Replayed {
			t.Fatalf("result = %+v, want confirmed", res)
		}
		if r := requireRow(t, db, "j1", jobs.StatusCompleted, 1, 0); !r.Finished {
			t.Fatal("finished_at is not set")
		}
		requireHooks(t, db, "j1", "on_completed", 1)
		requireCount(t, db, 1, `SELECT count(*) FROM hook_runs WHERE job_id = 'j1' AND parent_id = 'p1' AND tenant_id = 't1' AND type = 'report.export'`)
		requireCount(t, db, 1, `SELECT count(*) FROM products`)
		if n := db.Events(t, "j1", jobs.EventCompleted); n != 1 {
			t.Fatalf("completed events = %d, want 1", n)
		}
	})

	t.Run("LostCommitAcknowledgementIsReplayedAndTheCascadeRanOnce", func(t *testing.T) {
		t.Parallel()
		db, store, lease := start(t)
		// The first completion commits, but the worker never learns it (the
		// connection dropped after COMMIT was sent) and retries.
		requireNoErr(t, inTx(t, db, func(tx pgx.Tx) error {
			if _, err := store.Complete(ctx, tx, lease); err != nil {
				return err
			}
			return writeProduct(tx)
		}))
		ran := false
		res, err := store.CompleteWith(ctx, db.Pool, lease, func(tx pgx.Tx) error { ran = true; return writeProduct(tx) })
		requireNoErr(t, err)
		if !res.Replayed || !res.Confirmed || ran {
			t.Fatalf("retry = %+v, fn ran = %v; want replayed, confirmed, fn not run", res, ran)
		}
		requireNoErr(t, inTx(t, db, func(tx pgx.Tx) error {
			res, err := store.Complete(ctx, tx, lease)
			if err == nil && !res.Replayed {
				t.Errorf("plain Complete retry = %+v, want replayed", res)
			}
			return err
		}))
		requireRow(t, db, "j1", jobs.StatusCompleted, 1, 0)
		requireHooks(t, db, "j1", "on_completed", 1)
		requireCount(t, db, 1, `SELECT count(*) FROM products`)
		requireLate(t, db, "j1")
	})

	t.Run("CompletionOfAReapedJobIsTerminalAndWritesNoProductRows", func(t *testing.T) {
		t.Parallel()
		db, store, lease := start(t)
		backdate(t, db, "j1", 40*time.Minute, 20*time.Minute)
		if !reap(t, store, "j1") {
			t.Fatal("not reaped")
		}
		ran := false
		_, err := store.CompleteWith(ctx, db.Pool, lease, func(tx pgx.Tx) error { ran = true; return writeProduct(tx) })
		requireIs(t, err, jobs.ErrJobTerminal)
		if ran {
			t.Fatal("fn ran after a refused completion")
		}
		r := requireRow(t, db, "j1", jobs.StatusFailed, 1, 0)
		if r.FailureReason != jobs.ReasonStalled {
			t.Fatalf("failure reason = %q", r.FailureReason)
		}
		requireHooks(t, db, "j1", "on_completed", 0)
		requireHooks(t, db, "j1", "on_failed", 1)
		requireCount(t, db, 0, `SELECT count(*) FROM products`)
		d := requireLate(t, db, "j1", [2]string{"Complete", "job_terminal"})
		if d[0].CurrentStatus != jobs.StatusFailed || d[0].CurrentFailureReason != jobs.ReasonStalled {
			t.Fatalf("detail = %+v", d[0])
		}
	})

	t.Run("CompletionOfASupersededGenerationIsStale", func(t *testing.T) {
		t.Parallel()
		db, store, old := start(t)
		claim(t, store, "j1", 1, "w2")
		_, err := store.CompleteWith(ctx, db.Pool, old, writeProduct)
		requireIs(t, err, jobs.ErrStaleWorker)
		requireRow(t, db, "j1", jobs.StatusProcessing, 2, 0)
		requireHooks(t, db, "j1", "on_completed", 0)
		requireCount(t, db, 0, `SELECT count(*) FROM products`)
		requireLate(t, db, "j1", [2]string{"Complete", "stale_worker"})
	})

	t.Run("FailingWritesRollTheCompletionBack", func(t *testing.T) {
		t.Parallel()
		db, store, lease := start(t)
		boom := errors.New("insert failed")
		_, err := store.CompleteWith(ctx, db.Pool, lease, func(tx pgx.Tx) error { return boom })
		requireIs(t, err, boom)
		requireRow(t, db, "j1", jobs.StatusProcessing, 1, 0)
		requireHooks(t, db, "j1", "on_completed", 0)
		_, err = store.CompleteWith(ctx, db.Pool, lease, writeProduct)
		requireNoErr(t, err)
		requireRow(t, db, "j1", jobs.StatusCompleted, 1, 0)
		requireHooks(t, db, "j1", "on_completed", 1)
	})

	t.Run("CheckCompletedAcceptsOnlyThisGenerationsCompletion", func(t *testing.T) {
		t.Parallel()
		db, store, lease := start(t)
		charge := func(tx pgx.Tx) error { _, err := tx.Exec(ctx, `INSERT INTO products VALUES ('charge')`); return err }
		requireIs(t, store.AfterCompleted(ctx, db.Pool, lease, charge), jobs.ErrNotCompleted)
		_, err := store.CompleteWith(ctx, db.Pool, lease, nil)
		requireNoErr(t, err)
		requireNoErr(t, store.AfterCompleted(ctx, db.Pool, lease, charge))
		stale := lease
		stale.Generation = 0
		requireIs(t, store.AfterCompleted(ctx, db.Pool, stale, charge), jobs.ErrStaleWorker)
		requireCount(t, db, 1, `SELECT count(*) FROM products WHERE job_id = 'charge'`)
		requireLate(t, db, "j1", [2]string{"CheckCompleted", "stale_worker"})
	})
}

func TestAutoComplete(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("AutoCompleteTypeIsCompletedWithItsCascade", func(t *testing.T) {
		t.Parallel()
		db, store := setup(t, recordingCascades)
		db.Exec(t, hookTable)
		db.Exec(t, `UPDATE job_types SET auto_complete = true WHERE name = 'report.export'`)
		lease := queued(t, db, store, jobstest.Job{ID: "j1", Type: "report.export"}, "w1")
		res, err := store.AutoComplete(ctx, lease)
		requireNoErr(t, err)
		if !res.Confirmed || res.Replayed {
			t.Fatalf("result = %+v", res)
		}
		requireRow(t, db, "j1", jobs.StatusCompleted, 1, 0)
		requireHooks(t, db, "j1", "on_completed", 1)
	})

	t.Run("OtherTypesAreRefusedUntouchedAndThenFailAsNoCompletion", func(t *testing.T) {
		t.Parallel()
		db, store := setup(t, recordingCascades)
		db.Exec(t, hookTable)
		lease := queued(t, db, store, jobstest.Job{ID: "j1", Type: "report.export"}, "w1")
		_, err := store.AutoComplete(ctx, lease)
		requireIs(t, err, jobs.ErrNotAutoComplete)
		requireRow(t, db, "j1", jobs.StatusProcessing, 1, 0)
		requireNoErr(t, store.Fail(ctx, lease, jobs.ReasonNoCompletion))
		if r := requireRow(t, db, "j1", jobs.StatusFailed, 1, 0); r.FailureReason != "no_completion" {
			t.Fatalf("failure reason = %q", r.FailureReason)
		}
		requireHooks(t, db, "j1", "on_failed", 1)
	})

	t.Run("AJobTheHandlerCompletedIsReplayedWhateverItsType", func(t *testing.T) {
		t.Parallel()
		db, store := setup(t, recordingCascades)
		db.Exec(t, hookTable)
		lease := queued(t, db, store, jobstest.Job{ID: "j1", Type: "report.export"}, "w1")
		_, err := store.CompleteWith(ctx, nil, lease, nil)
		requireNoErr(t, err)
		res, err := store.AutoComplete(ctx, lease)
		requireNoErr(t, err)
		if !res.Replayed {
			t.Fatalf("result = %+v, want replayed", res)
		}
		requireHooks(t, db, "j1", "on_completed", 1)
	})
}
