package pgcore

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// This file holds the transaction statements of jobreaper's own
// transactions: BEGIN, COMMIT and ROLLBACK, each under its own operation
// timeout. A transaction that also runs the caller's function
// (CompleteWith, AfterCompleted) must not bound that function with
// jobreaper's timeout: the function runs under the caller's context for as
// long as the caller allows, and only jobreaper's statements before and
// after it are bounded.

// Begin opens a transaction on db for operation op, with a timeout of its
// own for the BEGIN. Its error says that nothing was written.
func (c *Core) Begin(ctx context.Context, db TxBeginner, op string) (pgx.Tx, error) {
	bctx, cancel := context.WithTimeout(ctx, c.opTimeout)
	defer cancel()
	tx, err := db.Begin(bctx)
	if err != nil {
		return nil, fmt.Errorf("jobs.%s: the transaction could not begin%s; nothing was written: %w",
			op, c.timedOut(bctx, err), err)
	}
	return tx, nil
}

// Commit sends tx's COMMIT with a timeout of its own. When the COMMIT fails
// the error says what became of the transaction (see CommitOutcome).
func (c *Core) Commit(ctx context.Context, tx pgx.Tx) error {
	cctx, cancel := context.WithTimeout(ctx, c.opTimeout)
	defer cancel()
	err := tx.Commit(cctx)
	if err == nil {
		return nil
	}
	return CommitOutcome(err, c.timedOut(cctx, err))
}

// Rollback ends tx if it is still open, for a deferred call. It runs
// without ctx's cancellation and with a timeout of its own: a caller whose
// context ended still gets its transaction rolled back on a connection the
// pool can reuse (pgx discards a connection whose ROLLBACK failed, which
// rolls back too).
func (c *Core) Rollback(ctx context.Context, tx pgx.Tx) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.opTimeout)
	defer cancel()
	_ = tx.Rollback(rctx)
}

// timedOut returns " (timed out after <op timeout>)" when err came from
// ctx's own deadline, else "".
func (c *Core) timedOut(ctx context.Context, err error) string {
	if errors.Is(err, context.DeadlineExceeded) && ctx.Err() != nil {
		return fmt.Sprintf(" (timed out after %s)", c.opTimeout)
	}
	return ""
}

// CommitOutcome words a failed COMMIT by what it did to the transaction,
// with note (a timeout, or "") after the verb:
//
//   - PostgreSQL answered it and rolled back (pgx.ErrTxCommitRollback after
//     a failed statement, or a *pgconn.PgError such as a deferred
//     constraint or a serialization failure): nothing was committed.
//   - It was never sent (pgconn.SafeToRetry: the context was done or the
//     connection failed before a byte went out): nothing was committed; pgx
//     closes the connection, which rolls the transaction back.
//   - It was sent and no answer came (a timeout or a broken connection
//     mid-way): it may or may not have committed.
//
// The error wraps err, and ErrCommitUnknown in the last case.
func CommitOutcome(err error, note string) error {
	var pgErr *pgconn.PgError
	switch {
	case errors.Is(err, pgx.ErrTxCommitRollback):
		return fmt.Errorf("COMMIT answered ROLLBACK%s: a statement of the transaction had failed, so PostgreSQL rolled it back; nothing was committed: %w", note, err)
	case errors.As(err, &pgErr):
		return fmt.Errorf("PostgreSQL refused the COMMIT%s (SQLSTATE %s) and rolled the transaction back; nothing was committed: %w", note, pgErr.Code, err)
	case pgconn.SafeToRetry(err):
		return fmt.Errorf("the COMMIT was not sent%s; nothing was committed (the transaction is rolled back with its connection): %w", note, err)
	}
	return fmt.Errorf("the COMMIT was sent but no answer came back%s; whether it committed is unknown: %w: %w", note, ErrCommitUnknown, err)
}
