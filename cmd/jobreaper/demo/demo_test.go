package demo

import (
	"bytes"
	"context"
	"os"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// Machine services the CI job provides.
const (
	testDatabaseURLDefault = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
	testRedisURL           = "redis://127.0.0.1:6379/0"
	// closedURLs point at port 1, where nothing listens.
	closedDatabaseURL = "postgres://postgres@127.0.0.1:1/test?sslmode=disable"
	closedRedisURL    = "redis://127.0.0.1:1/0"
)

func testDatabaseURL() string {
	if u := os.Getenv("JOBREAPER_TEST_DATABASE_URL"); u != "" {
		return u
	}
	return testDatabaseURLDefault
}

var (
	schemaPattern = regexp.MustCompile(`jobreaper_demo_[0-9a-f]{8}`)
	queuePattern  = regexp.MustCompile(`jobreaper-demo-[0-9a-f]{8}`)
)

// runDemo runs the demo with a bound of two minutes and returns its exit
// code and output; the output is logged.
func runDemo(t *testing.T, opts Options) (code int, stdout, stderr string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out, errOut bytes.Buffer
	code = Run(ctx, opts, &out, &errOut)
	t.Logf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out.String(), errOut.String())
	return code, out.String(), errOut.String()
}

// requireServices fails the test, saying what to start, when the
// machine's PostgreSQL or Redis does not answer (the demo would otherwise
// fall back to its stand-ins).
func requireServices(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	for _, s := range []struct {
		name, url string
		addr      func(string) (string, string, error)
	}{{"PostgreSQL", testDatabaseURL(), postgresAddr}, {"Redis", testRedisURL, redisAddr}} {
		network, addr, err := s.addr(s.url)
		if err != nil {
			t.Fatal(err)
		}
		if !answers(ctx, network, addr) {
			t.Fatalf("%s for tests does not answer at %s; start it (make services) or set JOBREAPER_TEST_DATABASE_URL", s.name, addr)
		}
	}
}

// requireContains fails the test for every want missing from s.
func requireContains(t *testing.T, s string, wants ...string) {
	t.Helper()
	for _, want := range wants {
		if !strings.Contains(s, want) {
			t.Errorf("output lacks %q", want)
		}
	}
}

// requireSchemaGone fails the test when the demo's schema still exists in
// the database at databaseURL.
func requireSchemaGone(t *testing.T, databaseURL, schema string) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, databaseURL)
	if err != nil {
		t.Fatalf("connecting to check the schema is gone: %v", err)
	}
	defer conn.Close(ctx)
	var n int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_namespace WHERE nspname = $1`, schema).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Errorf("schema %s is left behind", schema)
	}
}

// requireQueueGone fails the test when Redis still holds the demo's
// queue, a key of it, or a marker of its jobs.
func requireQueueGone(t *testing.T, redisURL, queueName string) {
	t.Helper()
	ctx := context.Background()
	opt, err := redis.ParseURL(redisURL)
	if err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	member, err := rdb.SIsMember(ctx, "asynq:queues", queueName).Result()
	if err != nil {
		t.Fatal(err)
	}
	if member {
		t.Errorf("queue %s is still in asynq:queues", queueName)
	}
	suffix := strings.TrimPrefix(queueName, "jobreaper-demo-")
	for _, pattern := range []string{"asynq:{" + queueName + "}*", "jobreaper:reaped:demo-*-" + suffix} {
		keys, err := rdb.Keys(ctx, pattern).Result()
		if err != nil {
			t.Fatal(err)
		}
		if len(keys) > 0 {
			t.Errorf("keys left behind: %v", keys)
		}
	}
}

// TestDemoStoryHoldsOnMachineServices runs the demo against the machine's
// PostgreSQL and Redis: the story holds, the narration states its key
// facts, and the demo's schema, queue and markers are gone afterwards.
func TestDemoStoryHoldsOnMachineServices(t *testing.T) {
	t.Parallel()
	requireServices(t)
	code, stdout, _ := runDemo(t, Options{DatabaseURL: testDatabaseURL(), RedisURL: testRedisURL})
	if code != ExitStoryHeld {
		t.Fatalf("exit code %d, want %d", code, ExitStoryHeld)
	}
	requireContains(t, stdout, "reaped (FAILED, stalled)", "of 604800s", "refused", "resumed from its cursor",
		"left alone", "Replayed", "story held")
	if strings.Contains(stdout, "throwaway") || strings.Contains(stdout, "miniredis") {
		t.Errorf("the demo started a stand-in although the machine's services answer")
	}
	schema, queueName := schemaPattern.FindString(stdout), queuePattern.FindString(stdout)
	if schema == "" || queueName == "" {
		t.Fatalf("the narration names no schema or queue")
	}
	requireSchemaGone(t, testDatabaseURL(), schema)
	requireQueueGone(t, testRedisURL, queueName)
}

// TestDemoFallsBackToStandIns points both URLs at a closed port: the demo
// starts a throwaway PostgreSQL cluster and miniredis, the story holds, and
// the cluster's directory is gone afterwards. On a machine without
// PostgreSQL server binaries it prints the one-line instruction instead
// and exits non-zero.
func TestDemoFallsBackToStandIns(t *testing.T) {
	t.Parallel()
	parent := tempParent(t)
	code, stdout, stderr := runDemo(t, Options{DatabaseURL: closedDatabaseURL, RedisURL: closedRedisURL, TempDir: parent})
	if _, err := findPostgres(); err != nil {
		t.Logf("no PostgreSQL server binaries here (%v): expecting the instruction", err)
		requireInstruction(t, code, stderr)
		return
	}
	if code != ExitStoryHeld {
		t.Fatalf("exit code %d, want %d", code, ExitStoryHeld)
	}
	requireContains(t, stdout, "nothing answers at 127.0.0.1:1; started a throwaway cluster",
		"started an in-process stand-in (miniredis)", "reaped (FAILED, stalled)", "refused", "resumed from its cursor", "story held")
	left, err := os.ReadDir(parent)
	if err != nil {
		t.Fatal(err)
	}
	if len(left) != 0 {
		t.Errorf("the cluster's directory is left behind in %s: %v", parent, left)
	}
}

// TestDemoSaysWhatToInstallWithoutPostgres: nothing answers and no server
// binaries are found, so one line on stderr says what to install, and the
// demo exits ExitCannotRun without starting the story.
func TestDemoSaysWhatToInstallWithoutPostgres(t *testing.T) {
	t.Parallel()
	parent := tempParent(t)
	code, stdout, stderr := runDemo(t, Options{
		DatabaseURL: closedDatabaseURL, RedisURL: closedRedisURL, TempDir: parent,
		findPostgres: func() (pgBinaries, error) { return pgBinaries{}, errNoPostgres },
	})
	requireInstruction(t, code, stderr)
	if strings.Contains(stdout, "story") {
		t.Errorf("the story started without PostgreSQL:\n%s", stdout)
	}
	if left, _ := os.ReadDir(parent); len(left) != 0 {
		t.Errorf("left behind in %s: %v", parent, left)
	}
}

// TestDemoCleansUpWhenInterrupted cancels the demo during its reaper
// passes: it reports the interruption, exits ExitStoryBroke and still
// removes its schema, queue and markers.
func TestDemoCleansUpWhenInterrupted(t *testing.T) {
	t.Parallel()
	requireServices(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	out := &signalWriter{want: "pass 2 ", cancel: cancel}
	var errOut bytes.Buffer
	code := Run(ctx, Options{DatabaseURL: testDatabaseURL(), RedisURL: testRedisURL}, out, &errOut)
	stdout := out.String()
	t.Logf("exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout, errOut.String())
	if code != ExitStoryBroke {
		t.Fatalf("exit code %d, want %d", code, ExitStoryBroke)
	}
	requireContains(t, stdout, "story broke: interrupted")
	schema, queueName := schemaPattern.FindString(stdout), queuePattern.FindString(stdout)
	if schema == "" || queueName == "" {
		t.Fatalf("the narration names no schema or queue")
	}
	requireSchemaGone(t, testDatabaseURL(), schema)
	requireQueueGone(t, testRedisURL, queueName)
}

// signalWriter collects the narration and calls cancel once it contains
// want.
type signalWriter struct {
	mu     sync.Mutex
	buf    bytes.Buffer
	want   string
	cancel context.CancelFunc
}

func (s *signalWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n, err := s.buf.Write(p)
	if strings.Contains(s.buf.String(), s.want) {
		s.cancel()
	}
	return n, err
}

func (s *signalWriter) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.String()
}

func requireInstruction(t *testing.T, code int, stderr string) {
	t.Helper()
	if code != ExitCannotRun {
		t.Errorf("exit code %d, want %d", code, ExitCannotRun)
	}
	lines := strings.Split(strings.TrimSpace(stderr), "\n")
	if len(lines) != 1 || !strings.Contains(lines[0], "install PostgreSQL") || !strings.Contains(lines[0], EnvDatabaseURL) {
		t.Errorf("stderr is not the one-line instruction:\n%s", stderr)
	}
}

// tempParent returns a directory for the demo's throwaway directories that
// the unprivileged user a root demo runs PostgreSQL as can reach (t.TempDir
// is private to its owner), removed when the test ends.
func tempParent(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "jobreaper-demo-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}
