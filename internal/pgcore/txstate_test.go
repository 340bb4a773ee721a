package pgcore_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/jobreaper/jobreaper/internal/pgcore"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
)

// TestCheckTxOpen shows that the transaction status pgx keeps from the
// server's last ReadyForQuery tells a transaction ended by one of its own
// statements, with no round trip, and that pgx's Commit alone would not.
func TestCheckTxOpen(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := jobstest.New(t)
	begin := func(t *testing.T) pgx.Tx {
		t.Helper()
		tx, err := db.Pool.Begin(ctx)
		requireNoErr(t, err)
		t.Cleanup(func() { _ = tx.Rollback(ctx) })
		_, err = tx.Exec(ctx, `INSERT INTO jobs (id, type, status) VALUES ($1, 'x', 'QUEUED')`, t.Name())
		requireNoErr(t, err)
		return tx
	}

	t.Run("OpenTransactionPasses", func(t *testing.T) {
		t.Parallel()
		requireNoErr(t, pgcore.CheckTxOpen(begin(t), "test"))
	})

	for _, stmt := range []string{"ROLLBACK", "COMMIT", "rollback -- copied from a script", "END", "ABORT"} {
		t.Run("EndedBy_"+strings.Fields(stmt)[0], func(t *testing.T) {
			t.Parallel()
			tx := begin(t)
			// As a cascade runs it: extended protocol, named arguments.
			_, err := tx.Exec(ctx, stmt, pgx.NamedArgs{"job_id": "x"})
			requireNoErr(t, err)
			err = pgcore.CheckTxOpen(tx, "the on_failed cascade of type x")
			requireIs(t, err, pgcore.ErrTxEnded)
			if !strings.Contains(err.Error(), "the on_failed cascade of type x: the transaction is no longer open") {
				t.Fatalf("error %q does not name what ended it", err)
			}
			// pgx's Commit sends COMMIT, which PostgreSQL answers with a
			// warning only: without the check the write looks committed.
			requireNoErr(t, tx.Commit(ctx))
			wantRows := int64(0)
			if stmt == "COMMIT" || stmt == "END" {
				wantRows = 1
			}
			requireCount(t, db, wantRows, `SELECT count(*) FROM jobs WHERE id = $1`, t.Name())
		})
	}

	t.Run("SavepointEndedByRollback", func(t *testing.T) {
		t.Parallel()
		sp, err := begin(t).Begin(ctx)
		requireNoErr(t, err)
		_, err = sp.Exec(ctx, "ROLLBACK")
		requireNoErr(t, err)
		requireIs(t, pgcore.CheckTxOpen(sp, ""), pgcore.ErrTxEnded)
	})

	t.Run("FailedTransactionIsRefused", func(t *testing.T) {
		t.Parallel()
		tx := begin(t)
		if _, err := tx.Exec(ctx, `SELECT 1/0`); err == nil {
			t.Fatal("division by zero succeeded")
		}
		err := pgcore.CheckTxOpen(tx, "")
		requireIs(t, err, pgcore.ErrTxEnded)
		if !strings.Contains(err.Error(), "failed state") {
			t.Fatalf("error %q does not say the transaction failed", err)
		}
	})
}

// requireNoErr fails the test on err.
func requireNoErr(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// requireIs fails the test unless err wraps target.
func requireIs(t *testing.T, err, target error) {
	t.Helper()
	if !errors.Is(err, target) {
		t.Fatalf("err = %v, want %v", err, target)
	}
}

// requireCount fails the test unless the integer query sql returns want.
func requireCount(t *testing.T, db *jobstest.DB, want int64, sql string, args ...any) {
	t.Helper()
	if got := db.Count(t, sql, args...); got != want {
		t.Fatalf("%s = %d, want %d", sql, got, want)
	}
}
