package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/jobreaper/jobreaper/jobs/jobstest"
	"github.com/jobreaper/jobreaper/queue"
	"github.com/jobreaper/jobreaper/queue/queuetest"
)

// testCA is a throwaway certificate authority and a server certificate it
// signed for 127.0.0.1 and localhost.
type testCA struct {
	caCert, serverCert, serverKey string
	// caKey and dir let issue sign more server certificates.
	caKey, dir string
}

// newTestCA makes a CA and a server certificate with openssl in dir.
func newTestCA(t *testing.T, dir, name string) testCA {
	t.Helper()
	p := func(f string) string { return filepath.Join(dir, name+"-"+f) }
	if err := os.WriteFile(p("san.ext"), []byte("subjectAltName=IP:127.0.0.1,DNS:localhost\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-days", "2",
			"-subj", "/CN=" + name + " throwaway CA", "-keyout", p("ca.key"), "-out", p("ca.crt")},
		{"req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
			"-subj", "/CN=localhost", "-keyout", p("server.key"), "-out", p("server.csr")},
		{"x509", "-req", "-in", p("server.csr"), "-CA", p("ca.crt"), "-CAkey", p("ca.key"), "-CAcreateserial",
			"-days", "2", "-extfile", p("san.ext"), "-out", p("server.crt")},
	} {
		if out, err := exec.Command("openssl", args...).CombinedOutput(); err != nil {
			t.Fatalf("openssl %v: %v\n%s", args, err, out)
		}
	}
	return testCA{caCert: p("ca.crt"), serverCert: p("server.crt"), serverKey: p("server.key"), caKey: p("ca.key"), dir: dir}
}

func freeTCPPort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// startTLSRedis runs a redis-server of the test's own that speaks only TLS
// on a free port and requires password; it returns its rediss:// URL and a
// client trusting ca.
func startTLSRedis(t *testing.T, ca testCA, password string) (string, *redis.Client) {
	t.Helper()
	port := freeTCPPort(t)
	cmd := exec.Command("redis-server", "--port", "0", "--tls-port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--tls-cert-file", ca.serverCert, "--tls-key-file", ca.serverKey, "--tls-ca-cert-file", ca.caCert,
		"--tls-auth-clients", "no", "--requirepass", password, "--save", "", "--appendonly", "no",
		"--dir", t.TempDir(), "--loglevel", "warning")
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting redis-server: %v", err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	pem, err := os.ReadFile(ca.caCert)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(pem)
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	rdb := redis.NewClient(&redis.Options{Addr: addr, Password: password, ContextTimeoutEnabled: true,
		TLSConfig: &tls.Config{RootCAs: roots, ServerName: "127.0.0.1", MinVersion: tls.VersionTLS12}})
	t.Cleanup(func() { _ = rdb.Close() })
	jobstest.Eventually(t, "the TLS redis-server answers", func() bool {
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		return rdb.Ping(ctx).Err() == nil
	})
	return "rediss://:" + password + "@" + addr + "/0", rdb
}

// startTLSPostgres runs a PostgreSQL cluster of the test's own, as the
// unprivileged postgres user (initdb refuses root), that accepts only TLS
// connections with a password on a free port. It returns the URL without
// sslmode parameters.
func startTLSPostgres(t *testing.T, ca testCA, password string) string {
	t.Helper()
	bins, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
	if len(bins) == 0 {
		t.Fatal("initdb not found under /usr/lib/postgresql: install Debian's postgresql package")
	}
	bin := filepath.Dir(bins[len(bins)-1])
	dir, err := os.MkdirTemp("", "jobreaper-tls-pg-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	data := filepath.Join(dir, "data")
	files := map[string]string{"pw": password + "\n"}
	for name, src := range map[string]string{"server.crt": ca.serverCert, "server.key": ca.serverKey} {
		b, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		files[name] = string(b)
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	asPostgres := func(args ...string) {
		t.Helper()
		out, err := exec.Command("runuser", append([]string{"-u", "postgres", "--"}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("%v: %v\n%s", args, err, out)
		}
	}
	if out, err := exec.Command("chown", "-R", "postgres:postgres", dir).CombinedOutput(); err != nil {
		t.Fatalf("chown: %v\n%s", err, out)
	}
	asPostgres(filepath.Join(bin, "initdb"), "-D", data, "-U", "postgres", "-A", "scram-sha-256",
		"--pwfile", filepath.Join(dir, "pw"), "-E", "UTF8", "--locale=C", "-N")
	// TLS only, with a password: no plain host line, no local socket trust.
	asPostgres("sh", "-c", "echo 'hostssl all all 127.0.0.1/32 scram-sha-256' > "+filepath.Join(data, "pg_hba.conf"))
	port := freeTCPPort(t)
	asPostgres(filepath.Join(bin, "pg_ctl"), "-D", data, "-l", filepath.Join(dir, "log"), "-w", "-t", "120", "-o",
		fmt.Sprintf("-p %d -k %s -c listen_addresses=127.0.0.1 -c ssl=on -c ssl_cert_file=%s -c ssl_key_file=%s -c fsync=off",
			port, dir, filepath.Join(dir, "server.crt"), filepath.Join(dir, "server.key")), "start")
	t.Cleanup(func() {
		_ = exec.Command("runuser", "-u", "postgres", "--", filepath.Join(bin, "pg_ctl"), "-D", data, "-m", "immediate", "-w", "stop").Run()
	})
	return (&url.URL{Scheme: "postgres", User: url.UserPassword("postgres", password),
		Host: fmt.Sprintf("127.0.0.1:%d", port), Path: "/postgres"}).String()
}

// requireNoSecret fails when r's output contains any of secrets.
func requireNoSecret(t *testing.T, r result, secrets ...string) {
	t.Helper()
	for _, s := range secrets {
		if strings.Contains(r.stdout+r.stderr, s) {
			t.Fatalf("output holds the secret %q:\nstdout: %s\nstderr: %s", s, r.stdout, r.stderr)
		}
	}
}

// TLS end to end: PostgreSQL with sslmode=verify-full and a Redis that
// speaks only TLS, each with its own throwaway CA and a password. migrate
// and a reaping pass work; a wrong CA for either stops the start with a
// clear error; no password appears in any output.
func TestTLSPostgresAndRedis(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	pgCA, redisCA, wrongCA := newTestCA(t, dir, "pg"), newTestCA(t, dir, "redis"), newTestCA(t, dir, "wrong")
	const pgPassword, redisPassword = "pg-Secret-4711", "redis-Secret-0815"
	pgURL := startTLSPostgres(t, pgCA, pgPassword)
	redisURL, rdb := startTLSRedis(t, redisCA, redisPassword)
	dbURL := func(ca string) string { return pgURL + "?sslmode=verify-full&sslrootcert=" + url.QueryEscape(ca) }
	secrets := []string{pgPassword, redisPassword}

	r := run(t, "migrate", "--database-url", dbURL(pgCA.caCert), "--schema", "jobreaper", "--log-level", "debug")
	requireExit(t, r, exitOK)
	requireNoSecret(t, r, secrets...)

	// A stalled job with its active task, to be reaped over TLS.
	ctx := t.Context()
	conn, err := pgx.Connect(ctx, dbURL(pgCA.caCert))
	if err != nil {
		t.Fatalf("connecting with verify-full: %v", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var ssl bool
	if err := conn.QueryRow(ctx, `SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()`).Scan(&ssl); err != nil || !ssl {
		t.Fatalf("the test's own connection is not TLS (ssl=%v, err=%v)", ssl, err)
	}
	q, id := unique("tls"), unique("Jtls")
	for _, stmt := range []string{
		`INSERT INTO jobreaper.job_types (name, max_runtime) VALUES ('report.export', '30 minutes')`,
		`INSERT INTO jobreaper.jobs (id, type, status, generation, queue, worker, started_at, updated_at)
		 VALUES ('` + id + `', 'report.export', 'PROCESSING', 1, '` + q + `', 'W1', now() - interval '31 minutes', now() - interval '21 minutes')`,
	} {
		if _, err := conn.Exec(ctx, stmt); err != nil {
			t.Fatal(err)
		}
	}
	// Active as a worker's dequeue makes it: state active, with a lease.
	if err := queuetest.MakeActive(ctx, rdb, q, "report.export", []string{id}); err != nil {
		t.Fatal(err)
	}

	t.Run("APassReapsOverTLS", func(t *testing.T) {
		r := run(t, "run", "--once", "--output", "json", "--log-level", "debug", "--database-url", dbURL(pgCA.caCert),
			"--schema", "jobreaper", "--redis-url", redisURL, "--redis-ca-file", redisCA.caCert, "--queues", q)
		requireExit(t, r, exitOK)
		requireNoSecret(t, r, secrets...)
		if doc := requireOneJSONResult(t, r.stdout); string(doc["reaped"]) != "1" {
			t.Fatalf("result %s, want 1 reaped", r.stdout)
		}
		if n, err := rdb.Exists(ctx, queue.MarkerKey(id)).Result(); err != nil || n != 1 {
			t.Fatalf("marker over TLS: exists=%d err=%v", n, err)
		}
	})

	t.Run("WrongRedisCAIsAClearErrorAtStart", func(t *testing.T) {
		r := run(t, "run", "--once", "--database-url", dbURL(pgCA.caCert), "--schema", "jobreaper",
			"--redis-url", redisURL, "--redis-ca-file", wrongCA.caCert, "--queues", q)
		requireExit(t, r, exitCannotRun)
		requireOneLineError(t, r, "cannot connect to Redis at rediss://", "not signed by a trusted CA", "--redis-ca-file")
		requireNoSecret(t, r, secrets...)
	})

	t.Run("SystemRootsDoNotTrustAThrowawayCA", func(t *testing.T) {
		r := run(t, "run", "--once", "--database-url", dbURL(pgCA.caCert), "--schema", "jobreaper",
			"--redis-url", redisURL, "--queues", q)
		requireExit(t, r, exitCannotRun)
		requireOneLineError(t, r, "not signed by a trusted CA", "--redis-ca-file")
		requireNoSecret(t, r, secrets...)
	})

	t.Run("WrongPostgresCAIsAClearErrorAtStart", func(t *testing.T) {
		r := run(t, "run", "--once", "--database-url", dbURL(wrongCA.caCert), "--schema", "jobreaper",
			"--redis-url", redisURL, "--redis-ca-file", redisCA.caCert, "--queues", q)
		requireExit(t, r, exitCannotRun)
		requireOneLineError(t, r, "PostgreSQL", "not signed by a trusted CA", "sslrootcert")
		requireNoSecret(t, r, secrets...)
	})

	t.Run("WrongPasswordsLeakNothing", func(t *testing.T) {
		wrongPG := strings.Replace(dbURL(pgCA.caCert), pgPassword, "pg-Wrong-1234", 1)
		r := run(t, "run", "--once", "--database-url", wrongPG, "--schema", "jobreaper",
			"--redis-url", redisURL, "--redis-ca-file", redisCA.caCert, "--queues", q)
		requireExit(t, r, exitCannotRun)
		requireNoSecret(t, r, append(secrets, "pg-Wrong-1234")...)
		wrongRedis := strings.Replace(redisURL, redisPassword, "redis-Wrong-5678", 1)
		r = run(t, "run", "--once", "--database-url", dbURL(pgCA.caCert), "--schema", "jobreaper",
			"--redis-url", wrongRedis, "--redis-ca-file", redisCA.caCert, "--queues", q)
		requireExit(t, r, exitCannotRun)
		requireNoSecret(t, r, append(secrets, "redis-Wrong-5678")...)
	})
}
