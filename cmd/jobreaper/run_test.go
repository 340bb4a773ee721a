package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/jobreaper/jobreaper/internal/redact"
	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
	"github.com/jobreaper/jobreaper/queue"
	"github.com/jobreaper/jobreaper/queue/queuetest"
	"github.com/jobreaper/jobreaper/reaper"
)

// onceArgs returns run --once's arguments against db and the test Redis,
// scanning queue, followed by extra.
func onceArgs(db *jobstest.DB, queue string, extra ...string) []string {
	return append([]string{"run", "--once", "--database-url", db.URL, "--schema", db.Schema,
		"--redis-url", redisTestURL(), "--queues", queue}, extra...)
}

// requireOneJSONResult fails unless stdout is exactly one JSON object with
// the summary's keys whose scanned tasks add up (reaper.Result's
// CheckScanned), and returns it.
func requireOneJSONResult(t *testing.T, stdout string) map[string]json.RawMessage {
	t.Helper()
	dec := json.NewDecoder(strings.NewReader(stdout))
	var doc map[string]json.RawMessage
	if err := dec.Decode(&doc); err != nil {
		t.Fatalf("stdout is not a JSON object: %v\n%s", err, stdout)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		t.Fatalf("stdout holds more than one JSON document: %q", stdout)
	}
	keys := make([]string, 0, len(doc))
	for k := range doc {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	const want = "at_risk,bad_queue_names,broken_active,errors,interrupted,lost_limit_tripped,markers_held,markers_restored," +
		"panicked,queues_did_you_mean,queues_not_found,reaped,reaped_by,retried_by,retries_finished,scanned,scanned_by,skipped,stale_queued," +
		"stall_storm_held,stall_storm_holds,uncovered_queues"
	if strings.Join(keys, ",") != want {
		t.Fatalf("keys %v, want %s", keys, want)
	}
	requireScannedAddsUp(t, stdout)
	return doc
}

// requireScannedAddsUp fails unless the run --once summary (or dry-run
// document) in stdout accounts for every scanned task in scanned_by.
func requireScannedAddsUp(t *testing.T, stdout string) {
	t.Helper()
	var res reaper.Result
	if err := json.Unmarshal([]byte(stdout), &res); err != nil {
		t.Fatalf("stdout is not a summary: %v\n%s", err, stdout)
	}
	if err := res.CheckScanned(); err != nil {
		t.Fatalf("summary %s: %v", stdout, err)
	}
}

func TestRunOnce(t *testing.T) {
	t.Parallel()

	t.Run("PrintsOneJSONDocumentForAnEmptyQueue", func(t *testing.T) {
		t.Parallel()
		db := jobstest.New(t)
		r := run(t, onceArgs(db, unique("empty"), "--output", "json")...)
		requireExit(t, r, exitOK)
		doc := requireOneJSONResult(t, r.stdout)
		for k, want := range map[string]string{"scanned": "0", "reaped": "0", "errors": "0", "skipped": "{}"} {
			if string(doc[k]) != want {
				t.Errorf("%s = %s, want %s", k, doc[k], want)
			}
		}
	})

	t.Run("PrintsAHumanSummaryByDefault", func(t *testing.T) {
		t.Parallel()
		db := jobstest.New(t)
		q := unique("empty")
		r := run(t, onceArgs(db, q)...)
		requireExit(t, r, exitOK)
		// The queue was never seen by asynq: the summary says so, since a
		// typo in --queues would otherwise look like a clean pass forever.
		if r.stdout != "scanned 0 active task(s): reaped 0, skipped 0, queues not known to asynq "+q+
			" (treated as empty: a typo, or the wrong Redis database?), errors 0\n" {
			t.Fatalf("stdout = %q", r.stdout)
		}
	})

	t.Run("TakesFlagsBeforeAndAfterTheCommand", func(t *testing.T) {
		t.Parallel()
		db := jobstest.New(t)
		q := unique("order")
		before := run(t, "--database-url", db.URL, "--schema", db.Schema, "--redis-url", redisTestURL(),
			"run", "--queues", q, "--once", "--output", "json")
		requireExit(t, before, exitOK)
		requireOneJSONResult(t, before.stdout)
		after := run(t, "run", "--output=json", "--once", "--queues", q, "--schema", db.Schema,
			"--redis-url", redisTestURL(), "--database-url", db.URL)
		requireExit(t, after, exitOK)
		requireOneJSONResult(t, after.stdout)
	})

	t.Run("ReapsAStalledJobAndMarksIt", func(t *testing.T) {
		t.Parallel()
		db := jobstest.New(t)
		rdb := realRedis(t)
		q, id := unique("reap"), unique("J5")
		db.JobType(t, "report.export", "30 minutes", "", "")
		db.Insert(t, jobstest.Job{ID: id, Type: "report.export", Generation: 1, Queue: q, Worker: "W1",
			StartedAgo: jobstest.Ago(31 * time.Minute), IdleAgo: 21 * time.Minute})
		activeTask(t, id, q)

		r := run(t, onceArgs(db, q, "--output", "json")...)

		requireExit(t, r, exitOK)
		doc := requireOneJSONResult(t, r.stdout)
		if string(doc["scanned"]) != "1" || string(doc["reaped"]) != "1" {
			t.Fatalf("result %s, want 1 scanned and 1 reaped", r.stdout)
		}
		if row := db.Read(t, id); row.Status != jobs.StatusFailed || row.FailureReason != jobs.ReasonStalled {
			t.Fatalf("row = %+v, want FAILED stalled", row)
		}
		if n, err := rdb.Exists(t.Context(), queue.MarkerKey(id)).Result(); err != nil || n != 1 {
			t.Fatalf("marker %s: exists=%d err=%v", queue.MarkerKey(id), n, err)
		}
		t.Cleanup(func() { rdb.Del(context.WithoutCancel(t.Context()), queue.MarkerKey(id)) })
	})

	t.Run("ExitsWith1WhenThePassHadErrors", func(t *testing.T) {
		t.Parallel()
		db := jobstest.New(t)
		rdb := realRedis(t)
		q := unique("broken")
		// A queue asynq knows whose active list is not a list: listing it
		// fails, which the pass counts as an error.
		ctx := t.Context()
		active := "asynq:{" + q + "}:active"
		if err := rdb.SAdd(ctx, "asynq:queues", q).Err(); err != nil {
			t.Fatal(err)
		}
		if err := rdb.Set(ctx, active, "not a list", 0).Err(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			ctx := context.WithoutCancel(t.Context())
			rdb.SRem(ctx, "asynq:queues", q)
			rdb.Del(ctx, active)
		})

		r := run(t, onceArgs(db, q, "--output", "json")...)

		requireExit(t, r, exitPassErrors)
		if doc := requireOneJSONResult(t, r.stdout); string(doc["errors"]) != "1" {
			t.Fatalf("errors = %s, want 1", doc["errors"])
		}

		text := run(t, onceArgs(db, q)...)
		requireExit(t, text, exitPassErrors)
		want := "scanned 0 active task(s): reaped 0, skipped 0, errors 1 (see the log on stderr; the next pass retries " +
			"a failed queue listing, load, task lookup or reap and re-sets a marker whose write failed; " +
			"a reaped job's FAILED row refuses its task meanwhile)\n"
		if text.stdout != want {
			t.Fatalf("stdout = %q\nwant     %q", text.stdout, want)
		}
	})

	t.Run("BadFlagExits2", func(t *testing.T) {
		t.Parallel()
		r := run(t, "run", "--once", "--no-such-flag")
		requireExit(t, r, exitCannotRun)
		requireOneLineError(t, r, "unknown flag: --no-such-flag", "jobreaper run --help")
	})

	t.Run("MalformedDurationExits2NamingTheFlag", func(t *testing.T) {
		t.Parallel()
		r := run(t, "run", "--once", "--interval", "5 minutes")
		requireExit(t, r, exitCannotRun)
		requireOneLineError(t, r, `"5 minutes"`, "--interval")
	})

	t.Run("UnknownOutputExits2", func(t *testing.T) {
		t.Parallel()
		r := run(t, "run", "--once", "--output", "xml")
		requireExit(t, r, exitCannotRun)
		requireOneLineError(t, r, `--output "xml"`, "text or json")
	})

	t.Run("UnreachableDatabaseExits2WithoutThePassword", func(t *testing.T) {
		t.Parallel()
		r := run(t, "run", "--once", "--database-url", "postgres://postgres:secret@127.0.0.1:1/x", "--queues", "q")
		requireExit(t, r, exitCannotRun)
		requireOneLineError(t, r, "PostgreSQL", "postgres://postgres:xxxxx@127.0.0.1:1/x", "check --database-url")
		if strings.Contains(r.stdout+r.stderr, "secret") {
			t.Fatalf("the password leaked: %q", r.stderr)
		}
	})

	t.Run("UnreachableRedisExits2WithoutThePassword", func(t *testing.T) {
		t.Parallel()
		db := jobstest.New(t)
		r := run(t, "run", "--once", "--database-url", db.URL, "--schema", db.Schema,
			"--redis-url", "redis://:hunter2@127.0.0.1:1/0", "--op-timeout", "2s")
		requireExit(t, r, exitCannotRun)
		if !strings.Contains(r.stderr, "cannot connect to Redis at redis://:xxxxx@127.0.0.1:1/0") ||
			!strings.Contains(r.stderr, "check --redis-url") {
			t.Fatalf("stderr = %q", r.stderr)
		}
		if strings.Contains(r.stdout+r.stderr, "hunter2") {
			t.Fatalf("the password leaked: %q", r.stderr)
		}
	})

	t.Run("UnmigratedSchemaExits2SayingToMigrate", func(t *testing.T) {
		t.Parallel()
		db := jobstest.New(t)
		r := run(t, "run", "--once", "--database-url", db.URL, "--schema", "nothing_here_"+strings.ToLower(db.Schema[len(db.Schema)-8:]),
			"--redis-url", redisTestURL())
		requireExit(t, r, exitCannotRun)
		requireOneLineError(t, r, "has no jobreaper tables", "jobreaper migrate")
		// One sentence: the schema and what to do first, the database last.
		want := regexp.MustCompile(`^jobreaper: schema "nothing_here_[a-z0-9_]+" has no jobreaper tables \(this binary ships version \d+\); run ` +
			"`jobreaper migrate --schema nothing_here_[a-z0-9_]+`" + ` with the same database URL, or correct the schema name \(database postgres://\S+\)\n$`)
		if !want.MatchString(r.stderr) {
			t.Fatalf("stderr %q does not read as one sentence of the expected form", r.stderr)
		}
	})
}

// B15, daemon side: a stall timeout below 2 x heartbeat + interval (11m
// here) stops the daemon before it starts, naming the field; nothing is
// clamped.
func TestCase_B15_DaemonRefusesStallTimeoutBelowTwoHeartbeatsPlusInterval(t *testing.T) {
	t.Parallel()
	r := run(t, "run", "--database-url", "postgres://u@127.0.0.1:1/x",
		"--stall-timeout", "5m", "--heartbeat-interval", "5m", "--interval", "1m")
	requireExit(t, r, exitCannotRun)
	requireOneLineError(t, r, "stall_timeout 5m0s is below 2 x heartbeat_interval (5m0s) + interval (1m0s) = 11m0s")
}

// activeTask enqueues a task with ID id on queue in the test Redis and
// moves it to asynq's active list, as a worker's dequeue would (state
// active, a lease), without running any handler.
func activeTask(t *testing.T, id, q string) {
	t.Helper()
	rdb := realRedis(t)
	if err := queuetest.MakeActive(t.Context(), rdb, q, "report.export", []string{id}); err != nil {
		t.Fatalf("making %s active: %v", id, err)
	}
	insp := asynq.NewInspectorFromRedisClient(rdb)
	t.Cleanup(func() {
		ctx := context.WithoutCancel(t.Context())
		rdb.Del(ctx, "asynq:{"+q+"}:active", "asynq:{"+q+"}:lease", "asynq:{"+q+"}:t:"+id)
		_ = insp.DeleteQueue(q, true)
		rdb.SRem(ctx, "asynq:queues", q)
	})
}

func TestRunDaemon(t *testing.T) {
	t.Parallel()

	t.Run("ServesMetricsAndStopsCleanlyWhenCancelled", func(t *testing.T) {
		t.Parallel()
		db := jobstest.New(t)
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		var stdout bytes.Buffer
		var stderr jobstest.SyncBuffer
		done := make(chan int, 1)
		go func() {
			done <- execute(ctx, []string{"run", "--database-url", db.URL, "--schema", db.Schema,
				"--redis-url", redisTestURL(), "--queues", unique("daemon"), "--interval", "100ms",
				"--stall-timeout", "11m", "--start-jitter", "0s", "--metrics-addr", "127.0.0.1:0"}, &stdout, &stderr)
		}()
		addrRE := regexp.MustCompile(`serving /metrics and /healthz" component=metrics addr=(\S+)`)
		var addr string
		jobstest.Eventually(t, "the metrics server listens", func() bool {
			if m := addrRE.FindStringSubmatch(stderr.String()); m != nil {
				addr = m[1]
			}
			return addr != ""
		})
		if body := get(t, "http://"+addr+"/healthz"); body != "ok\n" {
			t.Fatalf("/healthz = %q", body)
		}
		jobstest.Eventually(t, "two passes are counted", func() bool {
			return strings.Contains(get(t, "http://"+addr+"/metrics"), `jobreaper_passes_total{outcome="ok"} 2`)
		})

		cancel() // what SIGTERM does through signal.NotifyContext

		select {
		case code := <-done:
			if code != exitOK {
				t.Fatalf("exit code %d, want 0; stderr:\n%s", code, stderr.String())
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the daemon did not stop within 10s of cancellation")
		}
		if !strings.Contains(stderr.String(), "jobreaper stopped") || stdout.Len() != 0 {
			t.Fatalf("stdout %q, stderr:\n%s", stdout.String(), stderr.String())
		}
	})

	t.Run("MetricsPortInUseExits2", func(t *testing.T) {
		t.Parallel()
		db := jobstest.New(t)
		taken, err := (&net.ListenConfig{}).Listen(t.Context(), "tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer taken.Close()
		r := run(t, "run", "--database-url", db.URL, "--schema", db.Schema, "--redis-url", redisTestURL(),
			"--queues", unique("port"), "--metrics-addr", taken.Addr().String())
		requireExit(t, r, exitCannotRun)
		if !strings.Contains(r.stderr, "cannot listen on metrics_addr "+taken.Addr().String()) ||
			!strings.Contains(r.stderr, "choose a free --metrics-addr") {
			t.Fatalf("stderr = %q", r.stderr)
		}
	})
}

// get returns the body of an HTTP GET of url, failing the test on error.
func get(t *testing.T, url string) string {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	// No keep-alive: no idle connection may outlive the test (goleak).
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d %v", url, resp.StatusCode, err)
	}
	return string(body)
}

func TestRunCascades(t *testing.T) {
	t.Parallel()

	t.Run("CascadeThatDoesNotPrepareExits2NamingTheType", func(t *testing.T) {
		t.Parallel()
		db := jobstest.New(t)
		file := filepath.Join(t.TempDir(), "jobreaper.yaml")
		yaml := "cascades:\n  report.export:\n    on_failed:\n      - UPDATE no_such_table SET x = 1 WHERE id = @parent_id\n"
		if err := os.WriteFile(file, []byte(yaml), 0o600); err != nil {
			t.Fatal(err)
		}
		r := run(t, onceArgs(db, unique("cascade"), "--config", file)...)
		requireExit(t, r, exitCannotRun)
		requireOneLineError(t, r, `cascade on_failed of type "report.export", statement 1`, "no_such_table")
	})

	// B37: a cascade that would end the reap's transaction stops the start.
	t.Run("CascadeThatEndsTheTransactionExits2NamingTypeStatementAndRule", func(t *testing.T) {
		t.Parallel()
		db := jobstest.New(t)
		file := filepath.Join(t.TempDir(), "jobreaper.yaml")
		yaml := "cascades:\n  report.export:\n    on_failed:\n      - ROLLBACK\n"
		if err := os.WriteFile(file, []byte(yaml), 0o600); err != nil {
			t.Fatal(err)
		}
		r := run(t, onceArgs(db, unique("cascade"), "--config", file)...)
		requireExit(t, r, exitCannotRun)
		requireOneLineError(t, r, `cascade on_failed of type "report.export", statement 1 ("ROLLBACK") is refused`,
			"must be one PostgreSQL's PREPARE accepts")
	})
}

// A pass a signal stopped says so in both summaries, so that a script
// reading the JSON can tell it from a pass that counted errors.
func TestSummarySaysInterrupted(t *testing.T) {
	t.Parallel()
	res := reaper.Result{Scanned: 4, Reaped: 1, Interrupted: true}
	var js bytes.Buffer
	if err := printResult(&js, res, outputJSON, ""); err != nil {
		t.Fatal(err)
	}
	doc := requireOneJSONResult(t, js.String())
	if got := string(doc["interrupted"]); got != "true" {
		t.Fatalf("interrupted = %s, want true:\n%s", got, js.String())
	}
	var text bytes.Buffer
	if err := printResult(&text, res, outputText, ""); err != nil {
		t.Fatal(err)
	}
	if want := ", interrupted (a signal stopped the pass before its end: run it again), errors 0"; !strings.Contains(text.String(), want) {
		t.Fatalf("text summary lacks %q:\n%s", want, text.String())
	}
	text.Reset()
	res.Interrupted = false
	if err := printResult(&text, res, outputText, ""); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(text.String(), "interrupted") {
		t.Fatalf("a whole pass's summary says interrupted:\n%s", text.String())
	}
}

// A signal that comes while run --once is still connecting stops the pass
// before it begins: an interrupted summary and exit 1, not "cannot connect
// to PostgreSQL ... check --database-url" (exit 2), which would send the
// operator looking for an outage that is not there.
func TestRunOnceStoppedDuringStartUpIsInterrupted(t *testing.T) {
	t.Parallel()
	db := jobstest.New(t)
	ctx, cancel := context.WithCancel(t.Context())
	cancel() // what SIGTERM does through signal.NotifyContext
	var stdout bytes.Buffer
	var stderr jobstest.SyncBuffer
	code := execute(ctx, onceArgs(db, unique("stopped"), "--output", "json"), &stdout, &stderr)
	if code != exitPassErrors {
		t.Fatalf("exit code %d, want %d; stdout %q, stderr:\n%s", code, exitPassErrors, stdout.String(), stderr.String())
	}
	doc := requireOneJSONResult(t, stdout.String())
	for k, want := range map[string]string{"interrupted": "true", "scanned": "0", "reaped": "0", "errors": "0"} {
		if string(doc[k]) != want {
			t.Errorf("%s = %s, want %s", k, doc[k], want)
		}
	}
	if !strings.Contains(stderr.String(), "the pass was stopped by a signal before its end") || strings.Contains(stderr.String(), "cannot connect") {
		t.Fatalf("stderr:\n%s", stderr.String())
	}
}

// The daemon stopped while it is still connecting exits 0, as a stop
// after start-up does, without blaming the servers.
func TestDaemonStoppedDuringStartUpExitsCleanly(t *testing.T) {
	t.Parallel()
	db := jobstest.New(t)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	var stdout bytes.Buffer
	var stderr jobstest.SyncBuffer
	code := execute(ctx, []string{"run", "--database-url", db.URL, "--schema", db.Schema, "--redis-url", redisTestURL(),
		"--queues", unique("stopped"), "--metrics-addr", "127.0.0.1:0"}, &stdout, &stderr)
	if code != exitOK || stdout.Len() != 0 || !strings.Contains(stderr.String(), "jobreaper stopped during start-up") ||
		strings.Contains(stderr.String(), "cannot connect") {
		t.Fatalf("exit code %d (want 0), stdout %q, stderr:\n%s", code, stdout.String(), stderr.String())
	}
}

// The text summary names skipped queue names and held marker writes (with
// the Redis) only when there are some; the JSON always has their counts.
func TestSummaryCountsBadQueueNamesAndHeldMarkers(t *testing.T) {
	t.Parallel()
	res := reaper.Result{Scanned: 1, ScannedBy: map[string]int{"no_row": 1}, BadQueueNames: 2, MarkersHeld: 3}
	var js bytes.Buffer
	if err := printResult(&js, res, outputJSON, "10.0.0.5:6379/8"); err != nil {
		t.Fatal(err)
	}
	doc := requireOneJSONResult(t, js.String())
	if string(doc["bad_queue_names"]) != "2" || string(doc["markers_held"]) != "3" || string(doc["scanned_by"]) != `{"no_row":1}` {
		t.Fatalf("JSON summary %s, want bad_queue_names 2, markers_held 3, scanned_by {no_row: 1}", js.String())
	}
	var text bytes.Buffer
	if err := printResult(&text, res, outputText, "10.0.0.5:6379/8"); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{", bad_queue_names 2 (", ", markers_held 3 (", "in Redis 10.0.0.5:6379/8"} {
		if !strings.Contains(text.String(), want) {
			t.Fatalf("text summary lacks %q:\n%s", want, text.String())
		}
	}
	text.Reset()
	if err := printResult(&text, reaper.Result{}, outputText, "10.0.0.5:6379/8"); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(text.String(), "bad_queue_names") || strings.Contains(text.String(), "markers_held") {
		t.Fatalf("a summary with neither names them:\n%s", text.String())
	}
}

// redisName names a Redis as host:port/db, never with its password.
func TestRedisName(t *testing.T) {
	t.Parallel()
	for raw, want := range map[string]string{
		"redis://127.0.0.1:6379/8":                   "127.0.0.1:6379/8",
		"redis://:s3cret@cache.internal/2":           "cache.internal:6379/2",
		"rediss://user:s3cret@cache:6380":            "cache:6380/0",
		"redis://:s3cret@[::1]:6379/3":               "[::1]:6379/3",
		"redis://:s3cret@s1:26379/1?master_name=mym": "s1:26379/1 (Sentinel, master mym)",
		"redis://:s3cret@n1:7000?addr=n2:7000":       "n1:7000 (Cluster)",
		"unix://:s3cret@/run/redis.sock?db=4":        "unix:/run/redis.sock db 4",
	} {
		if got := redisName(raw); got != want || strings.Contains(got, "s3cret") {
			t.Errorf("redisName(%s) = %q, want %q", redact.URL(raw), got, want)
		}
	}
}
