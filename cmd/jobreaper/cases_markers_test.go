package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/jobreaper/jobreaper/internal/asynqstate"
	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
	"github.com/jobreaper/jobreaper/queue"
	"github.com/jobreaper/jobreaper/queue/redistest"
)

// b46 is case B46's world: a Redis of the test's own whose database 9
// holds the asynq queue "reports" with a live server serving it, and two
// jobs reaped an hour ago whose markers are missing: J46a's was written and
// then lost, J46b's write failed at the reap.
type b46 struct {
	db       *jobstest.DB
	srv      *redistest.Server
	db8, db9 *redis.Client
}

const b46Queue = "reports"

func newB46(t *testing.T) *b46 {
	t.Helper()
	w := &b46{db: jobstest.New(t), srv: redistest.Start(t)}
	w.db8, w.db9 = w.client(t, 8), w.client(t, 9)
	srv := asynq.NewServerFromRedisClient(w.db9, asynq.Config{Queues: map[string]int{b46Queue: 1},
		LogLevel: asynq.FatalLevel, ShutdownTimeout: time.Second})
	if err := srv.Start(asynq.HandlerFunc(func(context.Context, *asynq.Task) error { return nil })); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	// asynq knows a queue once a task was enqueued into it.
	if _, err := asynq.NewClientFromRedisClient(w.db9).EnqueueContext(t.Context(), asynq.NewTask("report.export", nil),
		asynq.Queue(b46Queue)); err != nil {
		t.Fatal(err)
	}
	reader := asynqstate.NewStatusReader(w.db9, 0)
	jobstest.Eventually(t, "a live server serves "+b46Queue+" in database 9", func() bool {
		live, err := reader.LiveQueues(t.Context())
		return err == nil && live[b46Queue]
	})
	w.db.JobType(t, "report.export", "30 minutes", "", "")
	for _, id := range []string{"J46a", "J46b"} {
		w.db.Insert(t, jobstest.Job{ID: id, Type: "report.export", Generation: 3, Queue: b46Queue,
			StartedAgo: jobstest.Ago(2 * time.Hour), IdleAgo: time.Hour})
	}
	w.db.Exec(t, `UPDATE jobs SET status = 'FAILED', failure_reason = 'stalled', finished_at = now() - interval '1 hour',
       marker_set_at = CASE id WHEN 'J46a' THEN now() - interval '1 hour' END`)
	return w
}

func (w *b46) client(t *testing.T, n int) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: w.srv.Addr, DB: n, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// url returns the redis:// URL of database n.
func (w *b46) url(n string) string { return "redis://" + w.srv.Addr + "/" + n }

func (w *b46) once(t *testing.T, redisURL string, extra ...string) result {
	t.Helper()
	return run(t, append([]string{"run", "--once", "--database-url", w.db.URL, "--schema", w.db.Schema, "--redis-url", redisURL}, extra...)...)
}

// requireNoMarkers fails if db holds any marker key.
func requireNoMarkers(t *testing.T, db *redis.Client, which string) {
	t.Helper()
	keys, err := db.Keys(t.Context(), queue.MarkerKeyPrefix+"*").Result()
	if err != nil || len(keys) != 0 {
		t.Fatalf("%s holds markers %v (%v), want none", which, keys, err)
	}
}

// B46: the queues live in database 9; a cron'd run --once reads database
// 8. No marker is written into database 8, the summary counts the held
// markers, the log names the Redis as host:port/db, and the exit code is
// 1. Against database 9 the same pass restores both markers. A misspelt
// queue gets a did-you-mean, and --strict-queues refuses it (exit 2).
func TestCase_B46_WrongRedisDatabaseOnACronRunOnce(t *testing.T) {
	t.Parallel()
	w := newB46(t)
	named := w.srv.Addr + "/8"

	r := w.once(t, w.url("8"), "--output", "json")
	requireExit(t, r, exitPassErrors)
	doc := requireOneJSONResult(t, r.stdout)
	if string(doc["markers_held"]) != "2" || string(doc["markers_restored"]) != "0" || string(doc["errors"]) != "0" {
		t.Fatalf("summary %s, want markers_held 2, markers_restored 0, errors 0", r.stdout)
	}
	if !strings.Contains(r.stderr, "level=WARN") || !strings.Contains(r.stderr, named) {
		t.Fatalf("no warning naming the Redis %s:\n%s", named, r.stderr)
	}
	requireNoMarkers(t, w.db8, "database 8")

	r = w.once(t, w.url("8"))
	requireExit(t, r, exitPassErrors)
	if !strings.Contains(r.stdout, "markers_held 2") || !strings.Contains(r.stdout, named) {
		t.Fatalf("text summary %q lacks markers_held 2 and the Redis %s", r.stdout, named)
	}
	requireNoMarkers(t, w.db8, "database 8")

	// The right database: both markers come back, with what is left of
	// their 7 days.
	r = w.once(t, w.url("9"), "--output", "json")
	requireExit(t, r, exitOK)
	doc = requireOneJSONResult(t, r.stdout)
	if string(doc["markers_held"]) != "0" || string(doc["markers_restored"]) != "2" {
		t.Fatalf("summary on database 9 %s, want markers_held 0 and markers_restored 2", r.stdout)
	}
	for _, id := range []string{"J46a", "J46b"} {
		if v, err := w.db9.Get(t.Context(), queue.MarkerKey(id)).Result(); err != nil || v != "3" {
			t.Fatalf("marker of %s in database 9 = %q, %v; want generation 3", id, v, err)
		}
	}

	// A misspelt queue: a did-you-mean in the warning and the text line.
	// No live server serves it, but no marker needs writing: a warning,
	// exit 0.
	r = w.once(t, w.url("9"), "--queues", "reprots")
	requireExit(t, r, exitOK)
	if !strings.Contains(r.stdout, `reprots (did you mean "reports"?)`) {
		t.Fatalf("text summary %q lacks the did-you-mean", r.stdout)
	}
	if !strings.Contains(r.stderr, `did_you_mean=reports`) {
		t.Fatalf("the warning lacks the did-you-mean:\n%s", r.stderr)
	}
	// --strict-queues refuses an unknown queue before the pass.
	r = w.once(t, w.url("9"), "--queues", "reprots", "--strict-queues", "--output", "json")
	requireExit(t, r, exitCannotRun)
	if msg := requireJSONError(t, r); !strings.Contains(msg, `"reprots"`) || !strings.Contains(msg, `did you mean "reports"?`) ||
		!strings.Contains(msg, w.srv.Addr+"/9") {
		t.Fatalf("error %q lacks the queue, the did-you-mean or the Redis", msg)
	}
	if n := w.db.Count(t, `SELECT count(*) FROM jobs WHERE status = $1`, jobs.StatusFailed); n != 2 {
		t.Fatalf("%d FAILED jobs, want the 2 of the fixture", n)
	}
}
