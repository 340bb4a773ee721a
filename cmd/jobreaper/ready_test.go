package main

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jobreaper/jobreaper/internal/fleettest"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
)

// daemon is a `jobreaper run` running in-process.
type daemon struct {
	stderr *jobstest.SyncBuffer
	addr   string
	cancel context.CancelFunc
	done   chan int
}

// startDaemon runs `jobreaper run` with args plus a metrics server on a
// free port, and waits until it serves. It is stopped at cleanup.
func startDaemon(t *testing.T, args ...string) *daemon {
	t.Helper()
	ctx, cancel := context.WithCancel(context.WithoutCancel(t.Context()))
	d := &daemon{stderr: &jobstest.SyncBuffer{}, cancel: cancel, done: make(chan int, 1)}
	go func() {
		var stdout jobstest.SyncBuffer
		d.done <- execute(ctx, append([]string{"run", "--metrics-addr", "127.0.0.1:0", "--start-jitter", "0s"}, args...), &stdout, d.stderr)
	}()
	addrRE := regexp.MustCompile(`serving /metrics and /healthz" component=metrics addr=(\S+)`)
	jobstest.Eventually(t, "the daemon's metrics server listens", func() bool {
		if m := addrRE.FindStringSubmatch(d.stderr.String()); m != nil {
			d.addr = m[1]
		}
		select {
		case code := <-d.done:
			t.Fatalf("the daemon exited with %d:\n%s", code, d.stderr.String())
		default:
		}
		return d.addr != ""
	})
	t.Cleanup(func() { d.stop(t) })
	return d
}

// stop cancels the daemon (as SIGTERM does) and waits for its exit.
func (d *daemon) stop(t *testing.T) int {
	d.cancel()
	select {
	case code := <-d.done:
		d.done <- code
		return code
	case <-time.After(30 * time.Second):
		t.Fatalf("the daemon did not stop within 30s:\n%s", d.stderr.String())
	}
	return -1
}

// probe returns the status code and body of GET path on the daemon,
// failing the test when nothing answers.
func (d *daemon) probe(t *testing.T, path string) (int, string) {
	t.Helper()
	code, body := fleettest.Probe(d.addr, path)
	if code == 0 {
		t.Fatalf("GET %s: %s", path, body)
	}
	return code, body
}

func TestReadyz(t *testing.T) {
	t.Parallel()
	db := jobstest.New(t)
	// The daemon reaches PostgreSQL through a relay the test cuts: the
	// shared server itself is never touched.
	relay, url := fleettest.RelayURL(t, db.URL)
	d := startDaemon(t, "--database-url", url, "--schema", db.Schema, "--redis-url", redisTestURL(),
		"--queues", unique("ready"), "--interval", "1s", "--stall-timeout", "11m", "--op-timeout", "2s")

	if code, body := d.probe(t, "/readyz"); code != http.StatusOK || body != "ready\n" {
		t.Fatalf("/readyz = %d %q, want 200 ready", code, body)
	}
	relay.Cut()
	var body string
	jobstest.Eventually(t, "/readyz answers 503 naming PostgreSQL", func() bool {
		var code int
		code, body = d.probe(t, "/readyz")
		return code == http.StatusServiceUnavailable
	})
	if !strings.Contains(body, "not ready: postgresql check failed") || strings.Contains(body, "redis") {
		t.Fatalf("/readyz body = %q", body)
	}
	if code, _ := d.probe(t, "/healthz"); code != http.StatusOK {
		t.Fatalf("/healthz = %d while PostgreSQL is away, want 200 (it stays as it is)", code)
	}
	relay.Restore()
	jobstest.Eventually(t, "/readyz answers 200 again", func() bool {
		code, _ := d.probe(t, "/readyz")
		return code == http.StatusOK
	})
	if code := d.stop(t); code != exitOK {
		t.Fatalf("exit code %d:\n%s", code, d.stderr.String())
	}
}

// A readiness check that panics (here: it has no pool and no client to
// ping) is recovered where it happens: logged once at ERROR with its
// stack, /readyz answers 503 saying so, and the checks stop when asked.
func TestReadinessCheckPanicIsContained(t *testing.T) {
	t.Parallel()
	var log jobstest.SyncBuffer
	ctx, cancel := context.WithCancel(t.Context())
	ready := startReadiness(ctx, nil, nil, time.Second, slog.New(slog.NewTextHandler(&log, nil)), nil)
	rec := httptest.NewRecorder()
	ready.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
	if rec.Code != http.StatusServiceUnavailable || !strings.Contains(rec.Body.String(), "panicked") {
		t.Fatalf("/readyz = %d %q, want 503 saying the check panicked", rec.Code, rec.Body.String())
	}
	cancel()
	ready.stop()
	if got := log.String(); strings.Count(got, "readiness check panicked") != 1 || !strings.Contains(got, "level=ERROR") ||
		!strings.Contains(got, "goroutine ") {
		t.Fatalf("the panic is not logged once at ERROR with its stack:\n%s", got)
	}
}
