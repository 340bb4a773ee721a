package demo

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// postgresGlobs are the places, besides PATH, where packages install the
// PostgreSQL server binaries; distributions keep initdb and postgres off
// PATH, in versioned directories.
var postgresGlobs = []string{
	"/usr/lib/postgresql/*/bin",                          // Debian, Ubuntu
	"/usr/pgsql-*/bin",                                   // RHEL, Fedora (PGDG packages)
	"/usr/local/pgsql/bin",                               // built from source
	"/opt/homebrew/opt/postgresql@*/bin",                 // Homebrew, Apple silicon
	"/usr/local/opt/postgresql@*/bin",                    // Homebrew, Intel
	"/Applications/Postgres.app/Contents/Versions/*/bin", // Postgres.app
}

// clusterStartTimeout bounds how long a fresh cluster may take to accept
// connections; initdb and the first start take a few seconds.
const clusterStartTimeout = 60 * time.Second

// clusterUser is the superuser initdb creates in the throwaway cluster.
const clusterUser = "jobreaper"

// pgBinaries are the two server programs a throwaway cluster needs.
type pgBinaries struct {
	dir, initdb, postgres string
}

// describe names the binaries for the narration: their version, else
// their directory.
func (b pgBinaries) describe(ctx context.Context) string {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, b.postgres, "--version").Output()
	if v := strings.TrimSpace(string(out)); err == nil && v != "" {
		return v + " from " + b.dir
	}
	return b.dir
}

// errNoPostgres is the one line that says what to install.
var errNoPostgres = fmt.Errorf("no PostgreSQL server binaries were found (searched PATH and %s): install PostgreSQL "+
	"(Debian/Ubuntu: apt-get install postgresql; Fedora/RHEL: dnf install postgresql-server; macOS: brew install postgresql) "+
	"or set %s to a running server", strings.Join(postgresGlobs, ", "), EnvDatabaseURL)

// findPostgres looks for a directory holding both initdb and postgres:
// PATH first (the user's choice), then postgresGlobs, newest version first.
// It returns errNoPostgres when there is none.
func findPostgres() (pgBinaries, error) {
	return searchPostgres(exec.LookPath, postgresGlobs)
}

// searchPostgres is findPostgres with its sources as arguments.
func searchPostgres(lookPath func(string) (string, error), globs []string) (pgBinaries, error) {
	if initdb, err := lookPath("initdb"); err == nil {
		if pg, err := lookPath("postgres"); err == nil {
			return pgBinaries{dir: filepath.Dir(initdb), initdb: initdb, postgres: pg}, nil
		}
	}
	for _, g := range globs {
		dirs, _ := filepath.Glob(g)
		slices.SortFunc(dirs, func(a, b string) int { return -compareVersions(a, b) })
		for _, dir := range dirs {
			b := pgBinaries{dir: dir, initdb: filepath.Join(dir, "initdb"), postgres: filepath.Join(dir, "postgres")}
			if isExecutable(b.initdb) && isExecutable(b.postgres) {
				return b, nil
			}
		}
	}
	return pgBinaries{}, errNoPostgres
}

func isExecutable(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0
}

var digits = regexp.MustCompile(`\d+`)

// compareVersions compares the numbers in two paths in order, so that
// /usr/lib/postgresql/16/bin sorts after /usr/lib/postgresql/9.6/bin.
func compareVersions(a, b string) int {
	na, nb := digits.FindAllString(a, -1), digits.FindAllString(b, -1)
	for i := 0; i < len(na) && i < len(nb); i++ {
		x, _ := strconv.Atoi(na[i])
		y, _ := strconv.Atoi(nb[i])
		if c := cmp.Compare(x, y); c != 0 {
			return c
		}
	}
	return cmp.Compare(len(na), len(nb))
}

// pgCluster is a throwaway PostgreSQL cluster: its data directory and its
// unix socket live in dir, removed by stop. It listens on no TCP port, so
// it cannot collide with a server on the machine.
type pgCluster struct {
	dir   string
	url   string
	runAs string
	cmd   *exec.Cmd
	logs  *syncBuffer
	// exited is closed when the server process has exited.
	exited chan struct{}
}

// startCluster runs initdb into a new directory under parent ("" means
// os.TempDir()) and starts postgres on a unix socket there, as an
// unprivileged user when the demo runs as root (initdb and postgres refuse
// root). It returns once the server accepts connections; on error nothing
// is left behind.
func startCluster(ctx context.Context, bins pgBinaries, parent string, log *slog.Logger) (*pgCluster, error) {
	user, err := unprivileged()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp(parent, "jobreaper-demo-")
	if err != nil {
		return nil, fmt.Errorf("creating the cluster's directory: %w", err)
	}
	c := &pgCluster{dir: dir, runAs: user.name, logs: &syncBuffer{}, exited: make(chan struct{})}
	fail := func(err error) (*pgCluster, error) {
		_ = c.stop(context.WithoutCancel(ctx))
		return nil, err
	}
	if err := user.own(dir); err != nil {
		return fail(fmt.Errorf("handing %s to %s: %w", dir, user.name, err))
	}
	data := filepath.Join(dir, "data")
	// -N: no fsync, the cluster lives for a minute. --locale=C: no
	// dependence on the machine's installed locales.
	initdb := exec.CommandContext(ctx, bins.initdb, "-D", data, "-U", clusterUser, "-A", "trust", "-E", "UTF8", "--locale=C", "-N")
	initdb.Dir, initdb.Env, initdb.SysProcAttr = dir, clusterEnv(), user.procAttr()
	if out, err := initdb.CombinedOutput(); err != nil {
		return fail(fmt.Errorf("initdb failed: %w: %s", err, lastLines(out, 3)))
	}
	// listen_addresses empty: the unix socket in dir only. fsync and
	// friends off: nothing here needs to survive a crash. The server
	// outlives a cancelled ctx on purpose: stop shuts it down in order,
	// after the demo has removed what it created.
	c.cmd = exec.CommandContext(context.WithoutCancel(ctx), bins.postgres, "-D", data, "-k", dir, "-p", "5432", "-c", "listen_addresses=",
		"-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off")
	c.cmd.Dir, c.cmd.Env, c.cmd.SysProcAttr = dir, clusterEnv(), user.procAttr()
	c.cmd.Stdout, c.cmd.Stderr = c.logs, c.logs
	if err := c.cmd.Start(); err != nil {
		c.cmd = nil
		return fail(fmt.Errorf("starting postgres: %w", err))
	}
	go func() {
		_ = c.cmd.Wait()
		close(c.exited)
	}()
	c.url = (&url.URL{
		Scheme:   "postgres",
		User:     url.User(clusterUser),
		Path:     "/postgres",
		RawQuery: url.Values{"host": {dir}, "port": {"5432"}, "sslmode": {"disable"}}.Encode(),
	}).String()
	if err := c.waitReady(ctx); err != nil {
		return fail(err)
	}
	log.Debug("throwaway PostgreSQL cluster started", "dir", dir, "run_as", user.name)
	return c, nil
}

func clusterEnv() []string {
	return []string{"PATH=" + os.Getenv("PATH"), "LC_ALL=C", "LANG=C"}
}

// waitReady polls until the server accepts a connection, it exits, or
// clusterStartTimeout passes.
func (c *pgCluster) waitReady(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, clusterStartTimeout)
	defer cancel()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		cctx, ccancel := context.WithTimeout(ctx, time.Second)
		conn, err := pgx.Connect(cctx, c.url)
		ccancel()
		if err == nil {
			_ = conn.Close(ctx)
			return nil
		}
		select {
		case <-c.exited:
			return fmt.Errorf("postgres exited at start: %s", lastLines(c.logs.Bytes(), 3))
		case <-ctx.Done():
			return fmt.Errorf("postgres did not accept connections within %s: %w: %s", clusterStartTimeout, ctx.Err(), lastLines(c.logs.Bytes(), 3))
		case <-tick.C:
		}
	}
}

// stop shuts the server down (SIGINT: fast shutdown, then a kill after 10
// s or when ctx ends) and removes the cluster's directory. It is safe to
// call on a half-started cluster.
func (c *pgCluster) stop(ctx context.Context) error {
	var errs []error
	if c.cmd != nil && c.cmd.Process != nil {
		_ = stopSignal(c.cmd.Process)
		select {
		case <-c.exited:
		case <-time.After(10 * time.Second):
			errs = append(errs, errors.New("postgres did not stop within 10s after SIGINT; killed"))
			_ = c.cmd.Process.Kill()
			<-c.exited
		case <-ctx.Done():
			_ = c.cmd.Process.Kill()
			<-c.exited
		}
	}
	if err := os.RemoveAll(c.dir); err != nil {
		errs = append(errs, fmt.Errorf("removing %s: %w", c.dir, err))
	}
	return errors.Join(errs...)
}

// lastLines returns the last n non-empty lines of out, joined by " | ",
// for an error message that stays on one line.
func lastLines(out []byte, n int) string {
	var lines []string
	for _, l := range strings.Split(string(out), "\n") {
		if l = strings.TrimSpace(l); l != "" {
			lines = append(lines, l)
		}
	}
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	if len(lines) == 0 {
		return "(no output)"
	}
	return strings.Join(lines, " | ")
}

// syncBuffer is a bytes.Buffer safe for the server's output and a reader.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// Bytes returns a copy of what was written.
func (b *syncBuffer) Bytes() []byte {
	b.mu.Lock()
	defer b.mu.Unlock()
	return bytes.Clone(b.buf.Bytes())
}
