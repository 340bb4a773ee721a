package jobstest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	neturl "net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// PgBouncerUser is the unprivileged account a test's PgBouncer runs as
// when the test runs as root: PgBouncer refuses to start as root, and CI
// runs as root. The postgres account exists wherever the PostgreSQL server
// package is installed.
const PgBouncerUser = "postgres"

// PgBouncerOptions configure StartPgBouncer. The zero value is the setup
// of case B40: transaction pooling, search_path ignored as a startup
// parameter, server-side prepared statements off.
type PgBouncerOptions struct {
	// IgnoreStartupParameters is PgBouncer's ignore_startup_parameters;
	// nil means "search_path", as such poolers are commonly configured.
	// An empty, non-nil slice ignores none: the pooler then refuses every
	// startup parameter it does not track itself (search_path, options,
	// extra_float_digits, ...).
	IgnoreStartupParameters []string
	// PoolSize is default_pool_size, the server connections per database
	// and user (default 10).
	PoolSize int
}

// PgBouncer is a PgBouncer process a test started in front of the test
// PostgreSQL server; the test's cleanup stops it.
type PgBouncer struct {
	// Host and Port are where it listens.
	Host string
	Port int
	// Version is what `pgbouncer --version` printed first ("1.18.0").
	Version string
	// PreparedStatementsPinned says the config sets max_prepared_statements
	// = 0. PgBouncer 1.21 introduced the setting (and 1.22 turned it on by
	// default); older versions refuse the key and never keep prepared
	// statements, which is the same behaviour.
	PreparedStatementsPinned bool

	user string
	log  *SyncBuffer
}

// StartPgBouncer starts PgBouncer on a free port of 127.0.0.1 in front of
// the server of DatabaseURL, with pool_mode = transaction, trust
// authentication for the URL's user, that user as admin (the pgbouncer
// console), and any database name passed through to the server. As root
// it runs as PgBouncerUser (runuser), with its config in a directory that
// user can read. It fails the test when pgbouncer is not installed (bash
// .ci/services.sh installs it) or does not answer within 10 s; its log is
// printed when the test fails. The process is killed at cleanup.
func StartPgBouncer(t testing.TB, opts PgBouncerOptions) *PgBouncer {
	t.Helper()
	bin, err := exec.LookPath("pgbouncer")
	if err != nil {
		bin = "/usr/sbin/pgbouncer" // Debian installs it outside a user's PATH
		if _, serr := os.Stat(bin); serr != nil {
			t.Fatalf("pgbouncer is not installed (bash .ci/services.sh installs Debian's package): %v", err)
		}
	}
	out, err := exec.Command(bin, "--version").Output()
	if err != nil {
		t.Fatalf("pgbouncer --version: %v", err)
	}
	version := versionPattern.FindString(string(out))
	server, err := pgconn.ParseConfig(DatabaseURL())
	if err != nil {
		t.Fatalf("parsing the test database URL: %v", err)
	}
	p := &PgBouncer{Host: "127.0.0.1", Version: version, user: server.User, log: &SyncBuffer{}}
	p.PreparedStatementsPinned = atLeast(version, 1, 21)

	dir, err := os.MkdirTemp("", "pgbouncer-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	// The unprivileged user reads the config through this directory.
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	// A port taken between the probe and PgBouncer's bind: try another.
	for attempt := 1; ; attempt++ {
		p.Port = freePort(t)
		err := p.start(t, bin, dir, server, opts)
		if err == nil {
			return p
		}
		if attempt == 3 {
			t.Fatalf("starting pgbouncer: %v\n%s", err, p.log.String())
		}
	}
}

var versionPattern = regexp.MustCompile(`\d+\.\d+(\.\d+)?`)

// atLeast reports whether version ("1.18.0") is at least major.minor.
func atLeast(version string, major, minor int) bool {
	parts := strings.Split(version, ".")
	if len(parts) < 2 {
		return false
	}
	ma, _ := strconv.Atoi(parts[0])
	mi, _ := strconv.Atoi(parts[1])
	return ma > major || ma == major && mi >= minor
}

func (p *PgBouncer) start(t testing.TB, bin, dir string, server *pgconn.Config, opts PgBouncerOptions) error {
	ignore := []string{"search_path"}
	if opts.IgnoreStartupParameters != nil {
		ignore = opts.IgnoreStartupParameters
	}
	poolSize := opts.PoolSize
	if poolSize <= 0 {
		poolSize = 10
	}
	var cfg strings.Builder
	fmt.Fprintf(&cfg, "[databases]\n* = host=%s port=%d\n\n[pgbouncer]\n", server.Host, server.Port)
	fmt.Fprintf(&cfg, "listen_addr = %s\nlisten_port = %d\nunix_socket_dir =\n", p.Host, p.Port)
	fmt.Fprintf(&cfg, "auth_type = trust\nauth_file = %s\nadmin_users = %s\n", filepath.Join(dir, "users.txt"), p.user)
	fmt.Fprintf(&cfg, "pool_mode = transaction\ndefault_pool_size = %d\nmax_client_conn = 500\n", poolSize)
	fmt.Fprintf(&cfg, "ignore_startup_parameters = %s\n", strings.Join(ignore, ","))
	if p.PreparedStatementsPinned {
		// On by default from 1.22: pinned off, so the clients' own
		// statement handling is what is tested.
		cfg.WriteString("max_prepared_statements = 0\n")
	}
	cfg.WriteString("log_connections = 0\nlog_disconnections = 0\n")
	file := filepath.Join(dir, "pgbouncer.ini")
	if err := os.WriteFile(file, []byte(cfg.String()), 0o644); err != nil {
		return err
	}
	users := fmt.Sprintf("%q \"\"\n", p.user)
	if err := os.WriteFile(filepath.Join(dir, "users.txt"), []byte(users), 0o644); err != nil {
		return err
	}

	var cmd *exec.Cmd
	if os.Geteuid() == 0 {
		if _, err := user.Lookup(PgBouncerUser); err != nil {
			t.Fatalf("pgbouncer refuses to run as root and there is no %s user to run it as: %v", PgBouncerUser, err)
		}
		cmd = exec.Command("runuser", "-u", PgBouncerUser, "--", bin, file)
	} else {
		cmd = exec.Command(bin, file)
	}
	cmd.Stdout, cmd.Stderr = p.log, p.log
	// Its own process group: the cleanup stops runuser and pgbouncer
	// together, and nothing else.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return err
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	stop := func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-exited
		}
	}

	deadline := time.Now().Add(10 * time.Second)
	for {
		select {
		case err := <-exited:
			return fmt.Errorf("pgbouncer exited at start: %v", err)
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		conn, err := pgx.Connect(ctx, p.AdminURL())
		cancel()
		if err == nil {
			_ = conn.Close(context.Background())
			break
		}
		if time.Now().After(deadline) {
			stop()
			return fmt.Errorf("pgbouncer did not answer on %s:%d within 10s: %w", p.Host, p.Port, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Cleanup(func() {
		stop()
		if t.Failed() {
			t.Logf("pgbouncer log:\n%s", p.log.String())
		}
	})
	return nil
}

// URL returns a URL of database through the pooler as the test user, with
// params ("default_query_exec_mode=exec", ...) appended.
func (p *PgBouncer) URL(database string, params ...string) string {
	u := fmt.Sprintf("postgres://%s@%s:%d/%s?sslmode=disable", p.user, p.Host, p.Port, database)
	for _, kv := range params {
		u += "&" + kv
	}
	return u
}

// AdminURL returns a URL of PgBouncer's admin console (SHOW POOLS, SHOW
// CONFIG), which speaks only the simple query protocol.
func (p *PgBouncer) AdminURL() string {
	return p.URL("pgbouncer", "default_query_exec_mode=simple_protocol")
}

// Show runs SHOW <what> on the admin console and returns the rows as
// maps of column name to text value.
func (p *PgBouncer) Show(t testing.TB, what string) []map[string]string {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, p.AdminURL())
	if err != nil {
		t.Fatalf("connecting to the pgbouncer console: %v", err)
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, "SHOW "+what)
	if err != nil {
		t.Fatalf("SHOW %s: %v", what, err)
	}
	defer rows.Close()
	var out []map[string]string
	for rows.Next() {
		vals := rows.RawValues()
		row := map[string]string{}
		for i, fd := range rows.FieldDescriptions() {
			row[fd.Name] = string(vals[i])
		}
		out = append(out, row)
	}
	if err := rows.Err(); err != nil {
		t.Fatalf("SHOW %s: %v", what, err)
	}
	return out
}

// freePort returns a TCP port of 127.0.0.1 nothing listened on a moment
// ago.
func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// SyncBuffer is a bytes.Buffer safe for a process (or daemon goroutine)
// writing while the test reads: a process log, a daemon's stderr.
type SyncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *SyncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *SyncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// NewDatabase creates a database of its own for the test on the server of
// DatabaseURL, for tests that must own the public schema (a decoy table
// that must stay empty), and drops it at cleanup (WITH (FORCE): a pooler's
// server connections may still be open). It returns the database's name
// and a direct URL of it.
func NewDatabase(t testing.TB) (name, url string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	name = SchemaName(t)
	admin, err := pgx.Connect(ctx, DatabaseURL())
	if err != nil {
		t.Fatalf("PostgreSQL for tests is not reachable (%v); start it (bash .ci/test starts it) or set JOBREAPER_TEST_DATABASE_URL", err)
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		t.Fatalf("creating database %s: %v", name, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		admin, err := pgx.Connect(ctx, DatabaseURL())
		if err == nil {
			defer admin.Close(ctx)
			_, err = admin.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
		}
		if err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("dropping database %s: %v", name, err)
		}
	})
	u, err := neturl.Parse(DatabaseURL())
	if err != nil {
		t.Fatalf("the test database URL is not a URL: %v", err)
	}
	u.Path = "/" + name
	return name, u.String()
}
