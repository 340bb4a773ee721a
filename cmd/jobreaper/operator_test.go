package main

import (
	"context"
	"encoding/json"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jackc/pgx/v5"

	"github.com/jobreaper/jobreaper/internal/asynqstate"
	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
	"github.com/jobreaper/jobreaper/queue"
	"github.com/jobreaper/jobreaper/queue/queuetest"
	"github.com/jobreaper/jobreaper/reaper"
)

// opsArgs returns the connection flags of db and the e2e Redis.
func opsArgs(db *jobstest.DB, args ...string) []string {
	return append(args, "--database-url", db.URL, "--schema", db.Schema, "--redis-url", e2eRedisURL)
}

func TestCancelCommand(t *testing.T) {
	t.Parallel()

	t.Run("CancelsTheRunningHandlerAndRefusesItsLateComplete", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		db := jobstest.New(t)
		rdb := e2eRedis(t)
		q := "cancel_" + db.Schema
		id := q + "-J"
		t.Cleanup(func() {
			_ = queuetest.Remove(context.Background(), rdb, q)
			rdb.Del(context.Background(), queue.MarkerKey(id))
		})
		db.JobType(t, "report.export", "30 minutes", "", "")
		db.Insert(t, jobstest.Job{ID: id, Type: "report.export", Status: jobs.StatusQueued, Queue: q})
		store := db.Store()

		// The handler waits for its context, then tries to complete.
		lateComplete := make(chan error, 1)
		running := make(chan struct{}, 1)
		w := startWorker(t, db, rdb, q, "w1", func(ctx context.Context, task *asynq.Task) error {
			lease, err := jobs.LeaseFromContext(ctx)
			if err != nil {
				return err
			}
			running <- struct{}{}
			<-ctx.Done()
			_, err = store.CompleteWith(context.WithoutCancel(ctx), db.Pool, lease, func(pgx.Tx) error { return nil })
			lateComplete <- err
			return ctx.Err()
		})
		t.Cleanup(w.srv.Shutdown)
		if _, err := queue.Enqueue(ctx, asynq.NewClientFromRedisClient(rdb), store, asynq.NewTask("report.export", nil), id); err != nil {
			t.Fatal(err)
		}
		select {
		case <-running:
		case <-time.After(30 * time.Second):
			t.Fatal("the handler did not start within 30s")
		}

		r := run(t, opsArgs(db, "cancel", "--reason", "customer withdrew the order", id)...)
		requireExit(t, r, exitOK)
		if !strings.Contains(r.stdout, "cancelled job \""+id+"\" (was PROCESSING, generation 1): marker set, cancel sent to its running handler") {
			t.Fatalf("stdout = %q", r.stdout)
		}
		select {
		case err := <-lateComplete:
			if !errors.Is(err, jobs.ErrJobTerminal) {
				t.Fatalf("late Complete = %v, want ErrJobTerminal", err)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("the handler's context was not cancelled within 30s")
		}
		row := db.Read(t, id)
		if row.Status != jobs.StatusFailed || row.FailureReason != jobs.ReasonCancelled || row.Generation != 1 {
			t.Fatalf("row = %+v, want FAILED cancelled at generation 1", row)
		}
		if n := db.Count(t, `SELECT count(*) FROM `+db.Table("job_events")+
			` WHERE job_id = $1 AND kind = 'cancelled' AND detail->>'reason' = 'customer withdrew the order'`, id); n != 1 {
			t.Fatalf("cancelled events = %d, want 1", n)
		}
		if late := db.LateResults(t, id); len(late) != 1 || late[0].Operation != "Complete" {
			t.Fatalf("late results = %+v, want the refused Complete", late)
		}
		if v, err := rdb.Get(ctx, queue.MarkerKey(id)).Result(); err != nil || v != "1" {
			t.Fatalf("marker = %q (%v), want generation 1", v, err)
		}
	})

	t.Run("RefusesFinishedAndUnknownJobs", func(t *testing.T) {
		t.Parallel()
		db := jobstest.New(t)
		db.JobType(t, "report.export", "30 minutes", "", "")
		db.Insert(t, jobstest.Job{ID: "done", Type: "report.export", Status: jobs.StatusCompleted})
		r := run(t, opsArgs(db, "cancel", "--reason", "x", "done", "nope")...)
		requireExit(t, r, exitPassErrors)
		// Refusals are lines of the command's output, on stdout like the
		// cancelled ones (and like requeue's); stderr has the summary.
		want := "refused job \"done\": it is COMPLETED; only a QUEUED or PROCESSING job can be cancelled; nothing changed\n" +
			"refused job \"nope\": no job has this ID (check the ID and --schema); nothing changed\n"
		if r.stdout != want || !strings.Contains(r.stderr, "2 job(s) not cancelled") {
			t.Fatalf("stdout = %q, want %q; stderr = %q", r.stdout, want, r.stderr)
		}
		if row := db.Read(t, "done"); row.Status != jobs.StatusCompleted {
			t.Fatalf("row = %+v", row)
		}
	})

	t.Run("RequiresAReason", func(t *testing.T) {
		t.Parallel()
		r := run(t, "cancel", "some-id")
		requireExit(t, r, exitCannotRun)
		requireOneLineError(t, r, "cancel needs --reason TEXT")
	})
}

func TestPruneCommand(t *testing.T) {
	t.Parallel()
	db := jobstest.New(t)
	db.JobType(t, "report.export", "30 minutes", "", "")
	for _, id := range []string{"old", "recent"} {
		db.Insert(t, jobstest.Job{ID: id, Type: "report.export", Status: jobs.StatusCompleted})
		db.Exec(t, `INSERT INTO `+db.Table("job_events")+` (job_id, kind, generation) VALUES ($1, 'claimed', 1), ($1, 'completed', 1)`, id)
		db.Exec(t, `INSERT INTO `+db.Table("job_batches")+` (job_id, token, generation, expected_cursor, count, cursor_after)
VALUES ($1, 'page-1', 1, 0, 10, 10)`, id)
	}
	db.Exec(t, `UPDATE `+db.Table("jobs")+` SET finished_at = now() - interval '30 days' WHERE id = 'old'`)
	db.Exec(t, `UPDATE `+db.Table("jobs")+` SET finished_at = now() - interval '8 days' + interval '1 hour' WHERE id = 'recent'`)
	args := []string{"--database-url", db.URL, "--schema", db.Schema}

	r := run(t, append([]string{"prune", "--older-than", "7d"}, args...)...)
	requireExit(t, r, exitPassErrors)
	requireOneLineError(t, r, "refused: --older-than 7d is less than 8 days")

	r = run(t, append([]string{"prune", "--older-than", "8d", "--dry-run"}, args...)...)
	requireExit(t, r, exitOK)
	if !strings.HasPrefix(r.stdout, "would delete 2 event(s) and 1 batch record(s)") {
		t.Fatalf("stdout = %q", r.stdout)
	}
	requireTotal := func(want int64, table string) {
		t.Helper()
		if n := db.Count(t, `SELECT count(*) FROM `+db.Table(table)); n != want {
			t.Fatalf("%s rows = %d, want %d", table, n, want)
		}
	}
	requireTotal(4, "job_events")

	r = run(t, append([]string{"prune", "--older-than", "192h"}, args...)...)
	requireExit(t, r, exitOK)
	if !strings.HasPrefix(r.stdout, "deleted 2 event(s) and 1 batch record(s)") {
		t.Fatalf("stdout = %q", r.stdout)
	}
	requireTotal(2, "job_events")
	requireTotal(1, "job_batches")
	requireTotal(2, "jobs")
	if n := db.Count(t, `SELECT count(*) FROM `+db.Table("job_events")+` WHERE job_id = 'recent'`); n != 2 {
		t.Fatalf("recent job's events = %d, want 2", n)
	}
	// One row per run that deleted (not the refused run, not the dry run),
	// naming who ran it.
	requireTotal(1, "prune_runs")
	if n := db.Count(t, `SELECT count(*) FROM `+db.Table("prune_runs")+
		` WHERE older_than = interval '8 days' AND events = 2 AND batches = 1 AND complete AND operator = $1`, operatorName()); n != 1 {
		t.Fatal("the prune's prune_runs row does not hold its counts, age and operator")
	}
}

func TestInspectCommand(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := jobstest.New(t)
	rdb := e2eRedis(t)
	q := "inspect_" + db.Schema
	id := q + "-J"
	t.Cleanup(func() {
		_ = queuetest.Remove(context.Background(), rdb, q)
		rdb.Del(context.Background(), queue.MarkerKey(id))
	})
	db.JobType(t, "report.export", "30 minutes", "", "")
	db.Exec(t, `UPDATE job_types SET reap_retries = 3 WHERE name = 'report.export'`)
	db.Insert(t, jobstest.Job{ID: id, Type: "report.export", Status: jobs.StatusQueued, Queue: q, Total: ptrTo(int64(30))})
	db.Exec(t, `UPDATE jobs SET reap_count = 2 WHERE id = $1`, id)
	store := db.Store()
	if _, err := queue.Enqueue(ctx, asynq.NewClientFromRedisClient(rdb), store, asynq.NewTask("report.export", nil), id); err != nil {
		t.Fatal(err)
	}
	if _, err := store.Claim(ctx, id, 0, "w1"); err != nil {
		t.Fatal(err)
	}
	if err := rdb.Set(ctx, queue.MarkerKey(id), "1", time.Hour).Err(); err != nil {
		t.Fatal(err)
	}

	r := run(t, opsArgs(db, "inspect", id, "--output", "json")...)
	requireExit(t, r, exitOK)
	var doc inspectDoc
	dec := json.NewDecoder(strings.NewReader(r.stdout))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&doc); err != nil {
		t.Fatalf("stdout is not one inspect document: %v\n%s", err, r.stdout)
	}
	if doc.Status != jobs.StatusProcessing || doc.Generation != 1 || doc.Worker != "w1" || doc.Queue != q ||
		doc.Total == nil || *doc.Total != 30 || doc.Limits == nil || doc.Limits.MaxRuntimeSeconds != 1800 ||
		doc.RuntimeSeconds == nil || doc.EventCount != 1 || len(doc.Events) != 1 || doc.Events[0].Kind != "claimed" ||
		!doc.Marker.Present || *doc.Marker.Generation != 1 || doc.Marker.TTLSeconds == nil ||
		*doc.Marker.TTLSeconds <= 0 || *doc.Marker.TTLSeconds > 3600 || doc.TaskState != string(asynqstate.TaskPending) ||
		doc.ReapCount != 2 || doc.ReapRetries != 3 || doc.Limits.ReapRetries != 3 || doc.Limits.ReapRetryDelaySeconds != 60 {
		t.Fatalf("document = %+v", doc)
	}

	// The enqueue helper gave the task the type's hard_timeout (24 h by
	// default) and no deadline.
	if doc.TaskTimeoutSeconds == nil || *doc.TaskTimeoutSeconds != 86400 || doc.TaskDeadline != nil {
		t.Fatalf("task timeout %v and deadline %v, want 86400 s and none", doc.TaskTimeoutSeconds, doc.TaskDeadline)
	}

	text := run(t, opsArgs(db, "inspect", id)...)
	requireExit(t, text, exitOK)
	for _, want := range []string{"status:         PROCESSING", "generation:     1", "worker:         w1", "progress:       cursor 0 of total 30",
		"marker:         present, generation 1", "asynq task:     pending (timeout 24h0m0s, no deadline)", "claimed",
		"reap retries:   reap_count 2 of reap_retries 3 in this life"} {
		if !strings.Contains(text.stdout, want) {
			t.Errorf("text output lacks %q:\n%s", want, text.stdout)
		}
	}

	// A task a producer enqueued with plain asynq, a short Timeout and a
	// Deadline: both are shown.
	short := q + "-short"
	deadline := time.Now().Add(time.Hour).Truncate(time.Second)
	db.Insert(t, jobstest.Job{ID: short, Type: "report.export", Status: jobs.StatusQueued, Queue: q})
	if _, err := asynq.NewClientFromRedisClient(rdb).EnqueueContext(ctx, asynq.NewTask("report.export", nil), asynq.TaskID(short),
		asynq.Queue(q), asynq.Timeout(3*time.Second), asynq.Deadline(deadline)); err != nil {
		t.Fatal(err)
	}
	r = run(t, opsArgs(db, "inspect", short, "--output", "json")...)
	requireExit(t, r, exitOK)
	doc = inspectDoc{}
	if err := json.Unmarshal([]byte(r.stdout), &doc); err != nil {
		t.Fatalf("stdout is not one inspect document: %v\n%s", err, r.stdout)
	}
	if doc.TaskTimeoutSeconds == nil || *doc.TaskTimeoutSeconds != 3 || doc.TaskDeadline == nil || !doc.TaskDeadline.Equal(deadline) {
		t.Fatalf("task timeout %v and deadline %v, want 3 s and %v", doc.TaskTimeoutSeconds, doc.TaskDeadline, deadline)
	}
	text = run(t, opsArgs(db, "inspect", short)...)
	requireExit(t, text, exitOK)
	if want := "asynq task:     pending (timeout 3s, deadline " + deadline.UTC().Format(time.RFC3339) + ")"; !strings.Contains(text.stdout, want) {
		t.Errorf("text output lacks %q:\n%s", want, text.stdout)
	}

	// Redis down (nothing listens on port 1): the row is PostgreSQL's and
	// is still shown; the marker and the task state are marked unreadable.
	noRedis := run(t, "inspect", id, "--output", "json", "--database-url", db.URL, "--schema", db.Schema, "--redis-url", "redis://127.0.0.1:1/0")
	requireExit(t, noRedis, exitOK)
	var down inspectDoc
	if err := json.Unmarshal([]byte(noRedis.stdout), &down); err != nil {
		t.Fatalf("inspect with Redis down: stdout is not one document: %v\n%s", err, noRedis.stdout)
	}
	const refused = "cannot connect to Redis at redis://127.0.0.1:1/0"
	if down.Status != jobs.StatusProcessing || down.Generation != 1 || down.EventCount != 1 || down.Marker.Present ||
		down.Marker.Generation != nil || !strings.Contains(down.Marker.Error, refused) ||
		!strings.HasPrefix(down.TaskState, "error: "+refused) || down.TaskTimeoutSeconds != nil || down.TaskDeadline != nil {
		t.Fatalf("inspect with Redis down = %+v", down)
	}
	if !strings.Contains(noRedis.stderr, "Redis unreachable: the marker and the asynq task state are shown as unreadable") {
		t.Fatalf("inspect with Redis down: stderr lacks the warning:\n%s", noRedis.stderr)
	}
	noRedisText := run(t, "inspect", id, "--database-url", db.URL, "--schema", db.Schema, "--redis-url", "redis://127.0.0.1:1/0")
	requireExit(t, noRedisText, exitOK)
	for _, want := range []string{"status:         PROCESSING", "marker:         unreadable: " + refused, "asynq task:     error: " + refused} {
		if !strings.Contains(noRedisText.stdout, want) {
			t.Errorf("text output with Redis down lacks %q:\n%s", want, noRedisText.stdout)
		}
	}

	// A Redis setting that cannot be used is a mistake to fix, not an
	// outage: inspect still refuses to run (exit 2) and names it.
	badCA := run(t, "inspect", id, "--database-url", db.URL, "--schema", db.Schema,
		"--redis-url", "rediss://127.0.0.1:6379/0", "--redis-ca-file", filepath.Join(t.TempDir(), "missing.pem"))
	requireExit(t, badCA, exitCannotRun)
	if !strings.Contains(badCA.stderr, "cannot read redis_ca_file") || badCA.stdout != "" {
		t.Fatalf("inspect with an unreadable --redis-ca-file: stdout %q, stderr %q", badCA.stdout, badCA.stderr)
	}
	badCAJSON := run(t, "inspect", id, "--output", "json", "--database-url", db.URL, "--schema", db.Schema,
		"--redis-url", "rediss://127.0.0.1:6379/0", "--redis-ca-file", filepath.Join(t.TempDir(), "missing.pem"))
	requireExit(t, badCAJSON, exitCannotRun)
	if msg := requireJSONError(t, badCAJSON); !strings.Contains(msg, "cannot read redis_ca_file") {
		t.Fatalf("inspect --output json that could not run: error %q", msg)
	}

	// The limits as applied: the type leaves stall_timeout and
	// hard_timeout to the defaults, and inspect says which they are.
	if want := "limits:         max_runtime 30m0s, stall_timeout 15m0s (daemon default), hard_timeout 24h0m0s (default)"; !strings.Contains(text.stdout, want) {
		t.Errorf("text output lacks %q:\n%s", want, text.stdout)
	}
	if doc.Limits.EffectiveStallTimeoutSeconds != 900 || doc.Limits.EffectiveHardTimeoutSeconds != 86400 || doc.Limits.StallTimeoutSeconds != nil {
		t.Errorf("limits = %+v, want effective stall 900 s and hard 86400 s, column stall null", *doc.Limits)
	}

	// A row whose timestamps the product set to infinity is printed, not
	// an error; nothing is computed from an infinite time.
	inf := q + "-inf"
	db.Insert(t, jobstest.Job{ID: inf, Type: "report.export", Status: jobs.StatusFailed, Queue: q})
	db.Exec(t, `UPDATE jobs SET created_at = '-infinity', started_at = '-infinity', updated_at = 'infinity',
       finished_at = 'infinity' WHERE id = $1`, inf)
	infJSON := run(t, opsArgs(db, "inspect", inf, "--output", "json")...)
	requireExit(t, infJSON, exitOK)
	var infDoc map[string]any
	if err := json.Unmarshal([]byte(infJSON.stdout), &infDoc); err != nil {
		t.Fatalf("inspect of infinite timestamps: %v\n%s", err, infJSON.stdout)
	}
	if infDoc["created_at"] != "-infinity" || infDoc["started_at"] != "-infinity" || infDoc["updated_at"] != "infinity" ||
		infDoc["finished_at"] != "infinity" || infDoc["runtime_seconds"] != nil || infDoc["idle_seconds"] != nil {
		t.Fatalf("inspect of infinite timestamps = %s", infJSON.stdout)
	}
	infText := run(t, opsArgs(db, "inspect", inf)...)
	requireExit(t, infText, exitOK)
	for _, want := range []string{"runtime:        unknown: started_at is -infinity", "idle:           unknown: updated_at is infinity",
		"times:          created -infinity, started -infinity, updated infinity, finished infinity"} {
		if !strings.Contains(infText.stdout, want) {
			t.Errorf("text output lacks %q:\n%s", want, infText.stdout)
		}
	}

	unknown := run(t, opsArgs(db, "inspect", "no-such-job")...)
	requireExit(t, unknown, exitPassErrors)
	requireOneLineError(t, unknown, `job "no-such-job" not found in schema`)
	unknownJSON := run(t, opsArgs(db, "inspect", "no-such-job", "--output", "json")...)
	requireExit(t, unknownJSON, exitPassErrors)
	var errDoc struct {
		Error string `json:"error"`
	}
	if err := json.Unmarshal([]byte(unknownJSON.stdout), &errDoc); err != nil || !strings.Contains(errDoc.Error, `job "no-such-job" not found`) {
		t.Fatalf("inspect --output json of an unknown job: stdout %q (%v), want one {\"error\"} document", unknownJSON.stdout, err)
	}
}

func ptrTo[T any](v T) *T { return &v }

func TestCLIHygiene(t *testing.T) {
	t.Parallel()

	t.Run("OnceOnTheRootSaysItBelongsToRun", func(t *testing.T) {
		t.Parallel()
		r := run(t, "--once")
		requireExit(t, r, exitCannotRun)
		requireOneLineError(t, r, "--once belongs to jobreaper run", "jobreaper run --once")
	})

	t.Run("UnknownFlagSuggestsTheClosest", func(t *testing.T) {
		t.Parallel()
		r := run(t, "run", "--stall-timout", "20m")
		requireExit(t, r, exitCannotRun)
		requireOneLineError(t, r, "unknown flag: --stall-timout", "did you mean --stall-timeout?")
	})

	t.Run("AFlagOfAnotherCommandNamesIt", func(t *testing.T) {
		t.Parallel()
		r := run(t, "prune", "--reason", "q")
		requireExit(t, r, exitCannotRun)
		requireOneLineError(t, r, "--reason belongs to jobreaper cancel and jobreaper release-hold and jobreaper requeue, not to jobreaper prune")
		// Owned by several commands: none is suggested (the first would be
		// cancel, a command that writes).
		if strings.Contains(r.stderr, "write:") {
			t.Fatalf("a flag of several commands suggests one of them: %s", r.stderr)
		}
	})

	t.Run("EachHelpListsOnlyItsFlags", func(t *testing.T) {
		t.Parallel()
		cases := map[string]struct{ has, hasNot []string }{
			"migrate": {has: []string{"--database-url", "--schema"}, hasNot: []string{"--queues", "--redis-url", "--once", "--stall-timeout"}},
			"prune":   {has: []string{"--older-than", "--dry-run", "--database-url"}, hasNot: []string{"--redis-url", "--queues", "--once"}},
			"inspect": {has: []string{"--output", "--redis-url"}, hasNot: []string{"--queues", "--once", "--interval"}},
			"cancel":  {has: []string{"--reason", "--redis-url", "--queues", "--limit"}, hasNot: []string{"--once", "--interval"}},
			"version": {hasNot: []string{"--database-url", "--config"}},
			"run":     {has: []string{"--once", "--queues", "--stall-timeout"}, hasNot: []string{"--reason", "--older-than"}},
		}
		for name, c := range cases {
			r := run(t, name, "--help")
			requireExit(t, r, exitOK)
			for _, f := range c.has {
				if !strings.Contains(r.stdout, f) {
					t.Errorf("%s --help lacks %s", name, f)
				}
			}
			for _, f := range c.hasNot {
				if strings.Contains(r.stdout, f+" ") {
					t.Errorf("%s --help lists %s, which it does not use", name, f)
				}
			}
		}
	})
}

// An operator command run without the daemon's cascades (no --config)
// says so when the daemon leading the schema recorded others, since the
// product status the daemon's on_failed or on_requeued would set is left
// as it was; with the same cascades (none on both sides) it says nothing.
func TestOperatorCommandWarnsWhenTheLeaderRunsOtherCascades(t *testing.T) {
	t.Parallel()
	db := jobstest.New(t)
	const warning = "the daemon leading this schema runs other cascades than this command"
	quiet := run(t, opsArgs(db, "cancel", "no-such-job", "--reason", "test")...)
	if strings.Contains(quiet.stderr, warning) {
		t.Fatalf("warning with no leader recorded:\n%s", quiet.stderr)
	}
	db.Exec(t, `INSERT INTO `+db.Table("leader_leases")+` (key, holder_id, holder_host, holder_pid, holder_started_at,
       acquired_at, renewed_at, expires_at, settings)
VALUES ('[]', 'h1', 'host', 1, now(), now(), now(), now() + interval '1 hour', '{"cascades": "0123456789abcdef"}')`)
	for _, args := range [][]string{{"cancel", "no-such-job", "--reason", "test"}, {"requeue", "no-such-job", "--reason", "test"}} {
		r := run(t, opsArgs(db, args...)...)
		if !strings.Contains(r.stderr, warning) || !strings.Contains(r.stderr, "0123456789abcdef") {
			t.Fatalf("%s with a leader running other cascades: stderr lacks the warning:\n%s", args[0], r.stderr)
		}
	}
	db.Exec(t, `UPDATE `+db.Table("leader_leases")+` SET settings = jsonb_build_object('cascades', $1::text)`,
		reaper.CascadesDigest(nil))
	if same := run(t, opsArgs(db, "cancel", "no-such-job", "--reason", "test")...); strings.Contains(same.stderr, warning) {
		t.Fatalf("warning with the same cascades:\n%s", same.stderr)
	}
}
