package jobstest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// ClusterUser is the unprivileged account a test's own PostgreSQL cluster
// runs as when the test runs as root (initdb and postgres refuse root).
const ClusterUser = "postgres"

// Cluster is a PostgreSQL cluster of the test's own, on a free port of
// 127.0.0.1 with trust authentication for the superuser postgres: for tests
// that stop, start or restart the server under the code they test, which
// the shared test server cannot be. The test's cleanup stops it (immediate
// shutdown) and removes its directory.
type Cluster struct {
	// URL is the postgres database's URL as the superuser postgres.
	URL string

	bin, dir, data string
	port           int
}

// StartCluster runs initdb (as ClusterUser when the test runs as root)
// into a temporary directory and starts the cluster with pg_ctl, without
// fsync (nothing in it needs to survive a crash). It fails the test when
// Debian's PostgreSQL server binaries are not installed under
// /usr/lib/postgresql or the cluster does not accept connections within
// 120 s.
func StartCluster(t testing.TB) *Cluster {
	t.Helper()
	initdbs, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
	if len(initdbs) == 0 {
		t.Fatal("initdb not found under /usr/lib/postgresql: install Debian's postgresql package (bash .ci/services.sh does)")
	}
	c := &Cluster{bin: filepath.Dir(initdbs[len(initdbs)-1])}
	dir, err := os.MkdirTemp("", "jobreaper-cluster-")
	if err != nil {
		t.Fatal(err)
	}
	c.dir, c.data = dir, filepath.Join(dir, "data")
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	if os.Geteuid() == 0 {
		if _, err := user.Lookup(ClusterUser); err != nil {
			t.Fatalf("initdb refuses to run as root and there is no %s user to run it as: %v", ClusterUser, err)
		}
		if out, err := exec.Command("chown", "-R", ClusterUser+":"+ClusterUser, dir).CombinedOutput(); err != nil {
			t.Fatalf("chown %s: %v\n%s", dir, err, out)
		}
	}
	c.run(t, filepath.Join(c.bin, "initdb"), "-D", c.data, "-U", "postgres", "-A", "trust", "-E", "UTF8", "--locale=C", "-N")
	c.port = freePort(t)
	c.URL = fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", c.port)
	c.Start(t)
	t.Cleanup(func() {
		_ = c.command(filepath.Join(c.bin, "pg_ctl"), "-D", c.data, "-m", "immediate", "-w", "stop").Run()
	})
	return c
}

// Start starts the stopped cluster and waits until it accepts connections.
func (c *Cluster) Start(t testing.TB) {
	t.Helper()
	c.run(t, filepath.Join(c.bin, "pg_ctl"), "-D", c.data, "-l", filepath.Join(c.dir, "log"), "-w", "-t", "120", "-o",
		fmt.Sprintf("-p %d -k %s -c listen_addresses=127.0.0.1 -c fsync=off", c.port, c.dir), "start")
	c.waitReady(t)
}

// Stop shuts the cluster down (fast: open sessions are ended).
func (c *Cluster) Stop(t testing.TB) {
	t.Helper()
	c.run(t, filepath.Join(c.bin, "pg_ctl"), "-D", c.data, "-m", "fast", "-w", "-t", "120", "stop")
}

// Restart restarts the cluster with pg_ctl restart (a fast shutdown,
// then a start) and waits until it accepts connections.
func (c *Cluster) Restart(t testing.TB) {
	t.Helper()
	c.run(t, filepath.Join(c.bin, "pg_ctl"), "-D", c.data, "-l", filepath.Join(c.dir, "log"), "-m", "fast", "-w", "-t", "120", "-o",
		fmt.Sprintf("-p %d -k %s -c listen_addresses=127.0.0.1 -c fsync=off", c.port, c.dir), "restart")
	c.waitReady(t)
}

// waitReady polls until the cluster accepts a connection, for 120 s.
func (c *Cluster) waitReady(t testing.TB) {
	t.Helper()
	deadline := time.Now().Add(120 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		conn, err := pgx.Connect(ctx, c.URL)
		cancel()
		if err == nil {
			_ = conn.Close(context.Background())
			return
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(filepath.Join(c.dir, "log"))
			t.Fatalf("the test's PostgreSQL cluster did not accept connections within 120s: %v\n%s", err, log)
		}
		time.Sleep(100 * time.Millisecond) // polling
	}
}

// command returns the command running name with args, as ClusterUser when
// the test runs as root.
func (c *Cluster) command(name string, args ...string) *exec.Cmd {
	if os.Geteuid() == 0 {
		return exec.Command("runuser", append([]string{"-u", ClusterUser, "--", name}, args...)...)
	}
	return exec.Command(name, args...)
}

func (c *Cluster) run(t testing.TB, name string, args ...string) {
	t.Helper()
	if out, err := c.command(name, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s %v: %v\n%s", filepath.Base(name), args, err, out)
	}
}
