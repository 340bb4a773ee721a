package pgcore

import (
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// ErrTxEnded: a statement run inside one of jobreaper's transactions (an
// operator's cascade with COMMIT or ROLLBACK, or a caller's function given
// to CompleteWith or AfterCompleted) ended that transaction before
// jobreaper's COMMIT. What ran before it was committed or rolled back by
// that statement and what ran after it ran outside any transaction, so the
// operation is not reported as done: its UPDATE, its event and its cascade
// did not commit together. It also stands for a transaction left failed
// ('E') by a statement whose error was not returned. PrepareCascades refuses
// cascade statements that control transactions at start; this error is the
// backstop for one that slipped through.
var ErrTxEnded = errors.New("the transaction was ended by one of its own statements before COMMIT")

// CheckTxOpen verifies, just before COMMIT, that tx is still an open,
// healthy transaction. It reads the transaction status PostgreSQL sent with
// its last ReadyForQuery message (pgconn.PgConn.TxStatus: 'I' idle, 'T' in a
// transaction, 'E' in a failed transaction), so it costs no round trip. A
// COMMIT or ROLLBACK run as a statement inside tx leaves 'I', and pgx's own
// Commit would then send a COMMIT that PostgreSQL answers with a warning
// only ("there is no transaction in progress"), reporting success.
//
// Call it once per transaction that ran operator or caller SQL, before
// COMMIT, never per statement. kind names what ran in the transaction
// ("the cascade of Reap", "CompleteWith's function"); "" when the caller's
// error wrapping names the operation already. The error wraps ErrTxEnded.
func CheckTxOpen(tx pgx.Tx, kind string) error {
	conn := tx.Conn()
	if conn == nil || conn.PgConn() == nil {
		return nil // not a pgx connection: nothing to read, COMMIT decides
	}
	st := conn.PgConn().TxStatus()
	if st == 'T' {
		return nil
	}
	what := "the transaction is no longer open (a COMMIT or ROLLBACK statement ran inside it)"
	if st == 'E' {
		what = "the transaction is in a failed state (a statement failed and its error was not returned)"
	}
	if kind != "" {
		what = kind + ": " + what
	}
	return fmt.Errorf("%s; nothing of it is reported as done: %w", what, ErrTxEnded)
}
