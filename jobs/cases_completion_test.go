package jobs_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
)

// The B35 case at a smaller scale, same shape: the case's operation
// timeout is 10 s and the completion's writes take 11 s; here the timeout
// is 300 ms and the writes take over 1 s.
const (
	b35OpTimeout = 300 * time.Millisecond
	b35Rows      = 50_000
)

// slowRows returns a completion function that writes b35Rows product rows
// for job id in 10 batches, pausing 100 ms after each: more than three
// times the operation timeout in all.
func slowRows(ctx context.Context, id string) func(pgx.Tx) error {
	return func(tx pgx.Tx) error {
		for b := range 10 {
			if _, err := tx.Exec(ctx, `INSERT INTO report_rows (job_id, n)
SELECT $1, g FROM generate_series($2::int * 5000 + 1, ($2::int + 1) * 5000) g`, id, b); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, `SELECT pg_sleep(0.1)`); err != nil {
				return err
			}
		}
		return nil
	}
}

// TestCase_B35_CompletionWhoseProductWritesAreSlowCommits: a handler calls
// CompleteWith whose function writes 50,000 product rows and takes longer
// than the operation timeout. The completion commits (COMPLETED, all rows
// there); jobreaper's own statements keep their timeout; a completion that
// does fail says what became of its transaction.
func TestCase_B35_CompletionWhoseProductWritesAreSlowCommits(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	setupB35 := func(t *testing.T) (*jobstest.DB, *jobs.Store, jobs.Lease) {
		db, _ := setup(t, nil)
		db.Exec(t, `CREATE TABLE report_rows (job_id text NOT NULL, n int NOT NULL)`)
		store := db.Store(jobs.WithOpTimeout(b35OpTimeout))
		return db, store, queued(t, db, store, jobstest.Job{ID: "J35", Type: "report.export"}, "W1")
	}

	t.Run("CommitsWithEveryRow", func(t *testing.T) {
		t.Parallel()
		db, store, lease := setupB35(t)
		start := time.Now()
		res, err := store.CompleteWith(ctx, db.Pool, lease, slowRows(ctx, "J35"))
		took := time.Since(start)
		requireNoErr(t, err)
		if !res.Confirmed || res.Replayed {
			t.Fatalf("CompleteWith = %+v, want confirmed", res)
		}
		requireRow(t, db, "J35", jobs.StatusCompleted, 1, 0)
		requireCount(t, db, b35Rows, `SELECT count(*) FROM report_rows WHERE job_id = 'J35'`)
		requireCount(t, db, 1, `SELECT count(*) FROM job_events WHERE job_id = 'J35' AND kind = 'completed'`)
		if took <= b35OpTimeout {
			t.Fatalf("the completion took %s, not longer than the %s timeout: the case's shape is lost", took, b35OpTimeout)
		}
		t.Logf("completion with %d rows took %s under a %s operation timeout", b35Rows, took, b35OpTimeout)
	})

	t.Run("JobreapersOwnStatementsKeepTheirTimeout", func(t *testing.T) {
		t.Parallel()
		db, store, lease := setupB35(t)
		// Another transaction holds the job's row: Complete waits on it.
		holder, err := db.Pool.Begin(ctx)
		requireNoErr(t, err)
		defer func() { _ = holder.Rollback(ctx) }()
		_, err = holder.Exec(ctx, `SELECT 1 FROM jobs WHERE id = 'J35' FOR UPDATE`)
		requireNoErr(t, err)
		called := false
		_, err = store.CompleteWith(ctx, db.Pool, lease, func(pgx.Tx) error { called = true; return nil })
		requireIs(t, err, context.DeadlineExceeded)
		for _, want := range []string{"jobs.Complete timed out after 300ms", "rolled back, nothing written"} {
			if !strings.Contains(err.Error(), want) {
				t.Fatalf("error %q does not say %q", err, want)
			}
		}
		if called {
			t.Fatal("the completion function ran although Complete failed")
		}
		requireNoErr(t, holder.Rollback(ctx))
		requireRow(t, db, "J35", jobs.StatusProcessing, 1, 0)
	})

	t.Run("CommitNeverSentSaysSoNotUnknown", func(t *testing.T) {
		t.Parallel()
		db, store, lease := setupB35(t)
		hctx, cancel := context.WithCancel(ctx)
		defer cancel()
		// The handler is cancelled (a shutdown) after its writes, before
		// COMMIT: the COMMIT is never sent.
		_, err := store.CompleteWith(hctx, db.Pool, lease, func(tx pgx.Tx) error {
			err := slowRows(hctx, "J35")(tx)
			cancel()
			return err
		})
		requireIs(t, err, context.Canceled)
		if errors.Is(err, jobs.ErrCommitUnknown) || strings.Contains(err.Error(), "unknown") {
			t.Fatalf("error %q calls a COMMIT that was never sent unknown", err)
		}
		if !strings.Contains(err.Error(), "the COMMIT was not sent") || !strings.Contains(err.Error(), "nothing was committed") {
			t.Fatalf("error %q does not say that the COMMIT was not sent and nothing committed", err)
		}
		requireRow(t, db, "J35", jobs.StatusProcessing, 1, 0)
		requireCount(t, db, 0, `SELECT count(*) FROM report_rows`)
	})

	t.Run("CommitRefusedByPostgreSQLSaysRolledBack", func(t *testing.T) {
		t.Parallel()
		db, store, lease := setupB35(t)
		db.Exec(t, `ALTER TABLE report_rows ADD CONSTRAINT one_per_n UNIQUE (job_id, n) DEFERRABLE INITIALLY DEFERRED`)
		_, err := store.CompleteWith(ctx, db.Pool, lease, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `INSERT INTO report_rows (job_id, n) VALUES ('J35', 1), ('J35', 1)`)
			return err // the duplicate is found at COMMIT
		})
		if err == nil || errors.Is(err, jobs.ErrCommitUnknown) {
			t.Fatalf("CompleteWith = %v, want a refused COMMIT", err)
		}
		if !strings.Contains(err.Error(), "PostgreSQL refused the COMMIT (SQLSTATE 23505) and rolled the transaction back; nothing was committed") {
			t.Fatalf("error %q does not say that PostgreSQL rolled the transaction back", err)
		}
		requireRow(t, db, "J35", jobs.StatusProcessing, 1, 0)
		requireCount(t, db, 0, `SELECT count(*) FROM report_rows`)
	})
}

// AfterCompleted also runs the caller's function inside jobreaper's
// transaction: a usage charge whose writes outlast the operation timeout
// commits too, while the check before it keeps its timeout.
func TestAfterCompletedFunctionIsNotBoundByTheOperationTimeout(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, _ := setup(t, nil)
	db.Exec(t, `CREATE TABLE report_rows (job_id text NOT NULL, n int NOT NULL)`)
	store := db.Store(jobs.WithOpTimeout(b35OpTimeout))
	lease := queued(t, db, store, jobstest.Job{ID: "J", Type: "report.export"}, "W1")
	res, err := store.CompleteWith(ctx, db.Pool, lease, nil)
	requireNoErr(t, err)
	if !res.Confirmed {
		t.Fatalf("CompleteWith = %+v, want confirmed", res)
	}

	requireNoErr(t, store.AfterCompleted(ctx, db.Pool, lease, slowRows(ctx, "J")))
	requireCount(t, db, b35Rows, `SELECT count(*) FROM report_rows WHERE job_id = 'J'`)

	// The check keeps its timeout: with the row held it times out, and
	// the function is not called.
	holder, err := db.Pool.Begin(ctx)
	requireNoErr(t, err)
	defer func() { _ = holder.Rollback(ctx) }()
	_, err = holder.Exec(ctx, `SELECT 1 FROM jobs WHERE id = 'J' FOR UPDATE`)
	requireNoErr(t, err)
	called := false
	err = store.AfterCompleted(ctx, db.Pool, lease, func(pgx.Tx) error { called = true; return nil })
	requireIs(t, err, context.DeadlineExceeded)
	if called || !strings.Contains(err.Error(), "jobs.CheckCompleted timed out after 300ms") {
		t.Fatalf("AfterCompleted with the row held = %v, fn called %v; want the check's timeout and no call", err, called)
	}
}
