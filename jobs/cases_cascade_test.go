package jobs_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/jobreaper/jobreaper/internal/pgstore"
	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
)

// TestCase_B37_CascadeThatEndsTheTransaction: an operator's on_failed
// cascade starts with ROLLBACK (or COMMIT). The daemon refuses to start,
// naming the type, the statement and the rule; and should such a statement
// slip through, no reap is reported as done unless its UPDATE, its event
// and its cascade committed together.
func TestCase_B37_CascadeThatEndsTheTransaction(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	endings := []string{"ROLLBACK", "COMMIT"}

	t.Run("PrepareCascadesRefusesTransactionControlNamingTypeStatementAndRule", func(t *testing.T) {
		t.Parallel()
		db, _ := setup(t, nil)
		db.Exec(t, `CREATE TABLE parents (id text PRIMARY KEY, failed int NOT NULL DEFAULT 0)`)
		db.Exec(t, `CREATE PROCEDURE some_procedure() LANGUAGE sql AS $$ SELECT 1 $$`)
		store := db.Store(jobs.WithCascades(jobs.Cascades{
			"report.export": {OnFailed: []string{
				"ROLLBACK",
				`UPDATE parents SET failed = failed + 1 WHERE id = @parent_id`,
				"COMMIT",
				"CALL some_procedure()",
				"DO $$ BEGIN PERFORM 1; END $$",
				"savepoint x",
			}},
			"crawl.site": {OnCompleted: []string{`UPDATE parents SET failed = 0 WHERE id = @parent_id;`}},
		}))
		err := store.PrepareCascades(ctx)
		requireIs(t, err, jobs.ErrBadCascade)
		rule := "a cascade statement must be one PostgreSQL's PREPARE accepts (SELECT, INSERT, UPDATE, DELETE, MERGE or VALUES)"
		for _, want := range []string{
			`cascade on_failed of type "report.export", statement 1 ("ROLLBACK") is refused: ` + rule,
			`cascade on_failed of type "report.export", statement 3 ("COMMIT") is refused: ` + rule,
			`cascade on_failed of type "report.export", statement 5 ("DO $$ BEGIN PERFORM 1; END $$") is refused: ` + rule,
			`cascade on_failed of type "report.export", statement 6 ("savepoint x") is refused: ` + rule,
			`cascade on_failed of type "report.export", statement 4 ("CALL some_procedure()") is refused: ` + rule,
		} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("error %q\nlacks %q", err, want)
			}
		}
		for _, good := range []string{`"report.export", statement 2`, `"crawl.site"`} {
			if strings.Contains(err.Error(), good) {
				t.Errorf("the valid statement %s was reported: %v", good, err)
			}
		}
		// The check prepared and deallocated its statement: a second check on
		// the same pooled connections works the same way.
		requireIs(t, store.PrepareCascades(ctx), jobs.ErrBadCascade)
		t.Log(err)
	})

	for _, ending := range endings {
		t.Run("ReapIsNotReportedWhenTheCascadeEndsTheTransactionWith"+ending, func(t *testing.T) {
			t.Parallel()
			db, _ := setup(t, nil)
			db.Exec(t, `CREATE TABLE parents (id text PRIMARY KEY, failed int NOT NULL DEFAULT 0)`)
			db.Exec(t, `INSERT INTO parents (id) VALUES ('P')`)
			// The start check is bypassed: the Store is used without
			// PrepareCascades, as if the statement had slipped through.
			store := db.Store(jobs.WithCascades(jobs.Cascades{"report.export": {OnFailed: []string{
				ending,
				`UPDATE parents SET failed = failed + 1 WHERE id = @parent_id`,
			}}}))
			db.Insert(t, jobstest.Job{ID: "J37", Type: "report.export", Generation: 1, ParentID: "P",
				StartedAgo: jobstest.Ago(31 * time.Minute), IdleAgo: 21 * time.Minute})
			sn, err := store.Get(ctx, "J37")
			requireNoErr(t, err)
			reaped, ev, err := jobs.DaemonOf(store).Reap(ctx, pgstore.ReapParams{JobID: "J37", Generation: sn.Generation,
				UpdatedAt: sn.UpdatedAt, Reason: jobs.ReasonStalled, Rule: rule})
			requireIs(t, err, jobs.ErrTxEnded)
			if reaped || ev.Generation != 0 {
				t.Fatalf("Reap = reaped %v, evidence %+v, want not reaped with a zero evidence", reaped, ev)
			}
			if !strings.Contains(err.Error(), "jobs.Reap") {
				t.Fatalf("error %q does not name the operation", err)
			}
			if ending == "ROLLBACK" {
				// The UPDATE and the event were rolled back by the cascade:
				// the job is still PROCESSING and the next pass reaps it.
				requireRow(t, db, "J37", jobs.StatusProcessing, 1, 0)
				requireCount(t, db, 0, `SELECT count(*) FROM job_events WHERE job_id = 'J37' AND kind = 'reaped'`)
			}
			// The statement after the ending ran outside any transaction
			// (autocommit), which is why the start check refuses the cascade.
			requireCount(t, db, 1, `SELECT failed FROM parents WHERE id = 'P'`)
		})
	}
}

// TestCascadeThatEndsTheTransactionInCompleteAndFail is a second instance
// of B37's kind: the completion cascade (Complete in the caller's
// transaction, CompleteWith) and Fail's cascade are checked before COMMIT
// the same way, and none of them reports its write as done.
func TestCascadeThatEndsTheTransactionInCompleteAndFail(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, _ := setup(t, nil)
	db.Exec(t, `CREATE TABLE usage (job_id text NOT NULL)`)
	store := db.Store(jobs.WithCascades(jobs.Cascades{"report.export": {
		OnFailed:    []string{"ROLLBACK"},
		OnCompleted: []string{"ROLLBACK"},
	}}))

	t.Run("CompleteTellsTheCallerBeforeItWritesItsRows", func(t *testing.T) {
		lease := queued(t, db, store, jobstest.Job{ID: "C1", Type: "report.export"}, "W1")
		tx, err := db.Pool.Begin(ctx)
		requireNoErr(t, err)
		defer func() { _ = tx.Rollback(ctx) }()
		_, err = store.Complete(ctx, tx, lease)
		requireIs(t, err, jobs.ErrTxEnded)
		if !strings.Contains(err.Error(), `on_completed cascade of type report.export`) {
			t.Fatalf("error %q does not name the cascade", err)
		}
		requireRow(t, db, "C1", jobs.StatusProcessing, 1, 0)
	})

	t.Run("CompleteWithIsNotConfirmedAndWritesNoRows", func(t *testing.T) {
		lease := queued(t, db, store, jobstest.Job{ID: "C2", Type: "report.export"}, "W1")
		called := false
		res, err := store.CompleteWith(ctx, nil, lease, func(tx pgx.Tx) error {
			called = true
			_, err := tx.Exec(ctx, `INSERT INTO usage VALUES ($1)`, lease.JobID)
			return err
		})
		requireIs(t, err, jobs.ErrTxEnded)
		if res.Confirmed || called {
			t.Fatalf("CompleteWith = %+v, fn called %v; want not confirmed and fn not called", res, called)
		}
		requireRow(t, db, "C2", jobs.StatusProcessing, 1, 0)
		requireCount(t, db, 0, `SELECT count(*) FROM usage`)
		requireCount(t, db, 0, `SELECT count(*) FROM job_events WHERE job_id = 'C2' AND kind = 'completed'`)
	})

	t.Run("CompleteWithRefusesAFunctionThatEndsTheTransaction", func(t *testing.T) {
		clean := db.Store()
		lease := queued(t, db, clean, jobstest.Job{ID: "C3", Type: "report.export"}, "W1")
		res, err := clean.CompleteWith(ctx, nil, lease, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `ROLLBACK`)
			return err
		})
		requireIs(t, err, jobs.ErrTxEnded)
		if res.Confirmed {
			t.Fatalf("CompleteWith = %+v, want not confirmed", res)
		}
		requireRow(t, db, "C3", jobs.StatusProcessing, 1, 0)
	})

	t.Run("FailIsNotReportedAsDone", func(t *testing.T) {
		lease := queued(t, db, store, jobstest.Job{ID: "F1", Type: "report.export"}, "W1")
		err := store.Fail(ctx, lease, "upstream_timeout")
		requireIs(t, err, jobs.ErrTxEnded)
		if !strings.Contains(err.Error(), "jobs.Fail") {
			t.Fatalf("error %q does not name the operation", err)
		}
		requireRow(t, db, "F1", jobs.StatusProcessing, 1, 0)
		requireCount(t, db, 0, `SELECT count(*) FROM job_events WHERE job_id = 'F1' AND kind = 'failed'`)
	})
}
