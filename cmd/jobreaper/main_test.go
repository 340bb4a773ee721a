package main

import (
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/jobreaper/jobreaper/reaper"
)

func TestMain(m *testing.M) {
	// The outage grace (outage_grace, default true) holds every job idle
	// since before PostgreSQL's start for one stall timeout, and these
	// tests backdate rows on a server CI may have started a moment ago (or
	// one a test starts itself): none of them is about an outage, so every
	// command and binary they run gets the grace off from the environment.
	// A test of the grace sets it on with its flag.
	if err := os.Setenv("JOBREAPER_OUTAGE_GRACE", "false"); err != nil {
		panic(err)
	}
	// Daemons run side by side: each one's status page listens on a free
	// port rather than on the default 127.0.0.1:9469. A test of the page
	// names its address with the flag.
	if err := os.Setenv("JOBREAPER_STATUS_ADDR", "127.0.0.1:0"); err != nil {
		panic(err)
	}
	// Every pool, client and server a command opens is closed before
	// execute returns, and tests close theirs at cleanup.
	goleak.VerifyTestMain(m)
}

// redisTestDB is the Redis database the tests that write asynq state use,
// so that no other package's queue discovery on database 0 sees their
// queues.
const redisTestDB = "10"

// redisTestURL is the real test Redis: JOBREAPER_TEST_REDIS_ADDR or
// 127.0.0.1:6379, database redisTestDB.
func redisTestURL() string {
	return "redis://" + cmp.Or(os.Getenv("JOBREAPER_TEST_REDIS_ADDR"), "127.0.0.1:6379") + "/" + redisTestDB
}

// realRedis returns a client of the test Redis database, closed at
// cleanup. It fails the test (never skips it) when Redis is not reachable.
func realRedis(t *testing.T) *redis.Client {
	t.Helper()
	opts, err := redis.ParseURL(redisTestURL())
	if err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(opts)
	t.Cleanup(func() { _ = c.Close() })
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("Redis for tests is not reachable at %s (%v); run `make services` or set JOBREAPER_TEST_REDIS_ADDR", redisTestURL(), err)
	}
	return c
}

// unique returns prefix + a random suffix, for queue names and job IDs
// that tests sharing one Redis must not mix up.
func unique(prefix string) string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return prefix + "-" + hex.EncodeToString(b[:])
}

// result is what one in-process run of the binary left behind.
type result struct {
	code           int
	stdout, stderr string
}

// run executes the command line args in-process, as main would, and
// returns its exit code and output.
func run(t *testing.T, args ...string) result {
	t.Helper()
	var stdout, stderr bytes.Buffer
	code := execute(t.Context(), args, &stdout, &stderr)
	t.Logf("jobreaper %s -> exit %d\nstdout: %s\nstderr: %s", strings.Join(args, " "), code, stdout.String(), stderr.String())
	requireNoScanMismatch(t, stderr.String())
	return result{code: code, stdout: stdout.String(), stderr: stderr.String()}
}

// requireNoScanMismatch fails the test when a pass of the log logged that
// its scanned tasks do not add up (reaper.ScannedMismatchLog): every pass
// a command runs in the tests is checked that way.
func requireNoScanMismatch(t *testing.T, log string) {
	t.Helper()
	if strings.Contains(log, reaper.ScannedMismatchLog) {
		t.Errorf("a pass's summary does not add up; the log:\n%s", log)
	}
}

// requireExit fails the test unless r exited with code.
func requireExit(t *testing.T, r result, code int) {
	t.Helper()
	if r.code != code {
		t.Fatalf("exit code %d, want %d; stderr: %s", r.code, code, r.stderr)
	}
}

// requireOneLineError fails unless stderr is one line that contains every
// fragment and stdout is empty.
func requireOneLineError(t *testing.T, r result, fragments ...string) {
	t.Helper()
	if r.stdout != "" {
		t.Errorf("stdout should be empty, got %q", r.stdout)
	}
	if strings.Count(r.stderr, "\n") != 1 || !strings.HasSuffix(r.stderr, "\n") {
		t.Errorf("stderr should be exactly one line, got %q", r.stderr)
	}
	for _, f := range fragments {
		if !strings.Contains(r.stderr, f) {
			t.Errorf("stderr %q lacks %q", r.stderr, f)
		}
	}
}
