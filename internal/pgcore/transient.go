package pgcore

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"syscall"

	"github.com/jackc/pgx/v5/pgconn"
)

// Transient reports whether err says that PostgreSQL could not be reached
// or asked for the statement to be tried again, so that the same write,
// sent again a moment later, may go through: the reading of the
// finalization retries below. (The outage grace asks a narrower question,
// "was the connection lost?", which ConnectionLost answers.) It accepts:
//
//   - connection-level failures: a dial refused or timed out, a connection
//     reset, closed or cut short (EOF), any net.Error, pgx's own
//     "conn closed", and the errors pgconn marks SafeToRetry (nothing was
//     sent) or Timeout (a deadline or a network timeout, the operation's
//     own timeout included);
//   - PostgreSQL's answers that a connection ended or cannot start: the
//     SQLSTATE class 08 (connection_exception), 57P01 admin_shutdown,
//     57P02 crash_shutdown and 57P03 cannot_connect_now (a restart);
//   - 40001 serialization_failure and 40P01 deadlock_detected, which
//     PostgreSQL asks the client to retry.
//
// A timeout cannot tell a database that does not answer from a statement
// that waited too long for a lock (pgx reports both as the context's
// deadline, not as a PostgreSQL error); both count as transient here;
// ConnectionLost counts neither, only a connect that timed out.
//
// Never transient: nil, context.Canceled (the caller gave up), any other
// PostgreSQL error (a constraint, a permission, a bad statement: sending
// it again gives the same answer), a closed pool, and jobreaper's own
// refusals (jobs.ErrStaleWorker, ErrJobTerminal and the like), which wrap none
// of the above.
func Transient(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) {
		return false
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case "40001", "40P01", "57P01", "57P02", "57P03":
			return true
		}
		return strings.HasPrefix(pgErr.Code, "08")
	}
	if pgconn.SafeToRetry(err) || pgconn.Timeout(err) || errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, pgconn.ErrConnClosed) || errors.Is(err, net.ErrClosed) {
		return true
	}
	var netErr net.Error
	if errors.As(err, &netErr) {
		return true
	}
	for _, errno := range []syscall.Errno{syscall.ECONNREFUSED, syscall.ECONNRESET, syscall.ECONNABORTED, syscall.EPIPE} {
		if errors.Is(err, errno) {
			return true
		}
	}
	return false
}

// ConnectionLost reports whether err says that the connection to
// PostgreSQL was lost or could not be made: the narrower reading of an
// outage that the daemon's outage grace counts (ConnWatch), where Transient
// is the broader one the finalization retries use. It accepts:
//
//   - any failure to connect (a *pgconn.ConnectError): a dial refused, reset
//     or timed out, a connect timeout, a server that cannot accept the
//     connection yet (57P03, the database system is starting up); but not
//     a refusal by a server that is up (a wrong password, a database that
//     does not exist, no connection slot left: every other SQLSTATE a
//     connect returns), which may repeat at every pass and would then hold
//     every job for good;
//   - on an open connection: a reset, closed or cut-short socket (EOF,
//     ECONNRESET, EPIPE, a net.Error that is not a timeout), and the
//     server's own word that it ended the session or the connection
//     (SQLSTATE class 08, 57P01 admin_shutdown, 57P02 crash_shutdown,
//     57P03 cannot_connect_now).
//
// It refuses what a single statement or row can cause again and again,
// so that one failing SQL row can never hold every job: every other
// server error (a deadlock, a serialization failure, a statement timeout
// or cancel, an operator cascade that raises, a permission), a statement
// that ran out of time on an open connection (pgx reports a lock wait the
// same way as a server that stopped answering), pgconn.ErrConnClosed (the
// driver closed the connection itself after such a timeout), a closed
// pool, context.Canceled and nil.
func ConnectionLost(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) {
		return false
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case "57P01", "57P02", "57P03":
			return true
		}
		return strings.HasPrefix(pgErr.Code, "08")
	}
	var connectErr *pgconn.ConnectError
	if errors.As(err, &connectErr) {
		return true
	}
	if pgconn.Timeout(err) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, pgconn.ErrConnClosed) {
		return false
	}
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed) {
		return true
	}
	for _, errno := range []syscall.Errno{syscall.ECONNREFUSED, syscall.ECONNRESET, syscall.ECONNABORTED, syscall.EPIPE} {
		if errors.Is(err, errno) {
			return true
		}
	}
	var netErr net.Error
	return errors.As(err, &netErr) && !netErr.Timeout()
}
