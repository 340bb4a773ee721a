package pgcore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Transient tells the errors worth sending again (PostgreSQL unreachable
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
		{"CommitUnknown", CommitOutcome(io.ErrUnexpectedEOF, ""), true},
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
		{"StaleWorker", fmt.Errorf("job j1: %w", errors.New("stale worker: the job was claimed by a newer attempt")), false},
		{"JobTerminal", ErrJobTerminal, false},
		{"NotAutoComplete", errors.New("job type is not auto-complete"), false},
		{"TxEnded", ErrTxEnded, false},
		{"CommitRefused", CommitOutcome(pg("23505"), ""), false},
		{"Other", errors.New("boom"), false},
	} {
		if got := Transient(c.err); got != c.want {
			t.Errorf("%s: Transient(%v) = %v, want %v", c.name, c.err, got, c.want)
		}
	}
}

// ConnectionLost, the outage grace's reading of an error, accepts only
// what says the connection was lost or could not be made, never what one
// statement or row can cause pass after pass. The errors are the driver's
// own, produced for real against the test server where they can be: a
// refused dial, a connect that timed out, a session the server ended, a
// socket closed under the driver, a statement timeout, a statement that ran
// out of the caller's time, a raised exception, a database that does not
// exist.
func TestConnectionLostClassifiesErrors(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	server := "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
	if u := os.Getenv("JOBREAPER_TEST_DATABASE_URL"); u != "" {
		server = u
	}
	connect := func(t *testing.T) *pgconn.PgConn {
		t.Helper()
		c, err := pgconn.Connect(ctx, server)
		if err != nil {
			t.Fatalf("PostgreSQL for tests is not reachable: %v", err)
		}
		t.Cleanup(func() { _ = c.Close(context.Background()) })
		return c
	}
	exec := func(c *pgconn.PgConn, sql string) error {
		_, err := c.Exec(ctx, sql).ReadAll()
		return err
	}

	_, refused := pgconn.Connect(ctx, "postgres://postgres@127.0.0.1:1/test?sslmode=disable&connect_timeout=5")
	// A listener that accepts and never answers: the connect times out.
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	go func() {
		for {
			conn, err := silent.Accept()
			if err != nil {
				return
			}
			defer conn.Close()
		}
	}()
	tctx, tcancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_, connectTimeout := pgconn.Connect(tctx, fmt.Sprintf("postgres://postgres@%s/test?sslmode=disable", silent.Addr()))
	tcancel()
	cfg, err := pgconn.ParseConfig(server)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Database = "no_such_database_for_jobreaper"
	_, noDatabase := pgconn.ConnectConfig(ctx, cfg)

	victim, admin := connect(t), connect(t)
	if err := exec(admin, fmt.Sprintf("SELECT pg_terminate_backend(%d)", victim.PID())); err != nil {
		t.Fatal(err)
	}
	var terminated error
	for deadline := time.Now().Add(10 * time.Second); terminated == nil && time.Now().Before(deadline); {
		terminated = exec(victim, "SELECT 1")
	}

	closedUnder := connect(t)
	_ = closedUnder.Conn().Close() // the socket goes away under the driver
	socketClosed := exec(closedUnder, "SELECT 1")

	slow := connect(t)
	sctx, scancel := context.WithTimeout(ctx, 200*time.Millisecond)
	_, ranOutOfTime := slow.Exec(sctx, "SELECT pg_sleep(5)").ReadAll()
	scancel()
	afterTimeout := exec(slow, "SELECT 1") // the driver closed it after the timeout

	plain := connect(t)
	statementTimeout := exec(plain, "SET statement_timeout = 50; SELECT pg_sleep(2)")
	raised := exec(plain, "RESET statement_timeout; DO $$ BEGIN RAISE EXCEPTION 'a cascade fails for one job'; END $$")

	t.Logf("the driver's errors: refused %v; connect timeout %v; no database %v; terminated %v; socket closed %v; "+
		"out of time %v, then %v; statement timeout %v; raised %v",
		refused, connectTimeout, noDatabase, terminated, socketClosed, ranOutOfTime, afterTimeout, statementTimeout, raised)
	pg := func(code string) error { return &pgconn.PgError{Severity: "ERROR", Code: code} }
	for _, c := range []struct {
		name string
		err  error
		want bool
	}{
		{"Nil", nil, false},
		{"DialRefused", refused, true},
		{"DialRefusedWrapped", fmt.Errorf("pgstore.PassClock: %w", refused), true},
		{"ConnectTimeout", connectTimeout, true},
		{"SessionEndedByTheServer", terminated, true},
		{"SocketClosedUnderTheDriver", socketClosed, true},
		{"ConnectionReset", &net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}, true},
		{"BrokenPipe", fmt.Errorf("write: %w", syscall.EPIPE), true},
		{"EOF", fmt.Errorf("receive message: %w", io.EOF), true},
		{"UnexpectedEOF", io.ErrUnexpectedEOF, true},
		{"CommitUnknown", CommitOutcome(io.ErrUnexpectedEOF, ""), true},
		{"AdminShutdown", pg("57P01"), true},
		{"CrashShutdown", pg("57P02"), true},
		{"CannotConnectNow", pg("57P03"), true},
		{"ConnectionFailure", pg("08006"), true},
		{"NoSuchDatabase", noDatabase, false},
		{"TooManyConnections", pg("53300"), false},
		{"StatementRanOutOfTheCallersTime", ranOutOfTime, false},
		{"OperationTimeout", fmt.Errorf("jobs.ReapBatch timed out after 10s: %w", context.DeadlineExceeded), false},
		{"ConnClosedByTheDriverAfterATimeout", afterTimeout, false},
		{"StatementTimeout", statementTimeout, false},
		{"CascadeRaises", raised, false},
		{"Deadlock", fmt.Errorf("cascade: %w", pg("40P01")), false},
		{"SerializationFailure", pg("40001"), false},
		{"NetTimeoutOnAnOpenConnection", &net.OpError{Op: "read", Net: "tcp", Err: os.ErrDeadlineExceeded}, false},
		{"Canceled", context.Canceled, false},
		{"UniqueViolation", pg("23505"), false},
		{"StaleWorker", fmt.Errorf("job j1: %w", errors.New("stale worker: the job was claimed by a newer attempt")), false},
		{"Other", errors.New("boom"), false},
	} {
		if got := ConnectionLost(c.err); got != c.want {
			t.Errorf("%s: ConnectionLost(%v) = %v, want %v", c.name, c.err, got, c.want)
		}
	}
	// What the driver returned is what the cases are named after.
	var pgErr *pgconn.PgError
	if !errors.As(statementTimeout, &pgErr) || pgErr.Code != "57014" {
		t.Errorf("the statement timeout returned %v, want SQLSTATE 57014", statementTimeout)
	}
	if !errors.As(raised, &pgErr) || pgErr.Code != "P0001" {
		t.Errorf("the raise returned %v, want SQLSTATE P0001", raised)
	}
	if !pgconn.Timeout(ranOutOfTime) || !errors.Is(afterTimeout, pgconn.ErrConnClosed) {
		t.Errorf("the statement out of time returned %v, then %v; want a timeout, then conn closed", ranOutOfTime, afterTimeout)
	}
	var connectErr *pgconn.ConnectError
	if !errors.As(connectTimeout, &connectErr) || !errors.As(noDatabase, &connectErr) || !errors.As(noDatabase, &pgErr) || pgErr.Code != "3D000" {
		t.Errorf("the connects returned %v and %v; want connect errors, the second with SQLSTATE 3D000", connectTimeout, noDatabase)
	}
}
