package jobs

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// transient tells the errors worth sending again (PostgreSQL unreachable
// or asking for a retry) from the rest, through any wrapping. The
// connection errors are the driver's own, produced for real: a refused
// dial and a closed pool.
func TestTransientClassifiesErrors(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// Nothing listens on port 1: pgx answers with its ConnectError.
	_, refused := pgconn.Connect(ctx, "postgres://postgres@127.0.0.1:1/test?sslmode=disable&connect_timeout=5")
	if refused == nil {
		t.Fatal("connecting to port 1 succeeded")
	}
	pool, err := pgxpool.New(ctx, "postgres://postgres@127.0.0.1:1/test?sslmode=disable")
	if err != nil {
		t.Fatal(err)
	}
	pool.Close()
	_, closedPool := pool.Exec(ctx, "SELECT 1")
	if closedPool == nil {
		t.Fatal("a closed pool ran a statement")
	}
	done, stop := context.WithCancel(ctx)
	stop()
	_, cancelled := pgconn.Connect(done, "postgres://postgres@127.0.0.1:1/test?sslmode=disable")

	pg := func(code string) error { return &pgconn.PgError{Severity: "ERROR", Code: code} }
	for _, c := range []struct {
		name string
		err  error
		want bool
	}{
		{"Nil", nil, false},
		{"DialRefused", refused, true},
		{"DialRefusedWrapped", fmt.Errorf("jobs.Fail: %w", refused), true},
		{"ConnectionReset", &net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}, true},
		{"BrokenPipe", fmt.Errorf("write: %w", syscall.EPIPE), true},
		{"EOF", fmt.Errorf("receive message: %w", io.EOF), true},
		{"UnexpectedEOF", io.ErrUnexpectedEOF, true},
		{"ConnClosed", fmt.Errorf("x: %w", pgconn.ErrConnClosed), true},
		{"NetClosed", net.ErrClosed, true},
		{"OperationTimeout", fmt.Errorf("jobs.Fail timed out after 10s: %w", context.DeadlineExceeded), true},
		{"CommitUnknown", commitOutcome(io.ErrUnexpectedEOF, ""), true},
		{"SerializationFailure", pg("40001"), true},
		{"Deadlock", fmt.Errorf("cascade: %w", pg("40P01")), true},
		{"AdminShutdown", pg("57P01"), true},
		{"CrashShutdown", pg("57P02"), true},
		{"CannotConnectNow", pg("57P03"), true},
		{"ConnectionFailure", pg("08006"), true},
		{"Canceled", context.Canceled, false},
		{"CanceledBeforeTheDial", cancelled, false},
		{"UniqueViolation", pg("23505"), false},
		{"PermissionDenied", pg("42501"), false},
		{"UndefinedTable", pg("42P01"), false},
		{"QueryCanceledByStatementTimeout", pg("57014"), false},
		{"ClosedPool", closedPool, false},
		{"StaleWorker", fmt.Errorf("job j1: %w", ErrStaleWorker), false},
		{"JobTerminal", ErrJobTerminal, false},
		{"NotAutoComplete", ErrNotAutoComplete, false},
		{"TxEnded", ErrTxEnded, false},
		{"CommitRefused", commitOutcome(pg("23505"), ""), false},
		{"Other", errors.New("boom"), false},
	} {
		if got := transient(c.err); got != c.want {
			t.Errorf("%s: transient(%v) = %v, want %v", c.name, c.err, got, c.want)
		}
	}
}
