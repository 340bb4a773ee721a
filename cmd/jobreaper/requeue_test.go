package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/jobreaper/jobreaper/internal/asynqstate"
	"github.com/jobreaper/jobreaper/internal/idcheck"
	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
	"github.com/jobreaper/jobreaper/queue"
	"github.com/jobreaper/jobreaper/queue/queuetest"
)

// requeueFixture is one test's schema and queue on the shared Redis.
type requeueFixture struct {
	db     *jobstest.DB
	rdb    *redis.Client
	q      string
	insp   *asynq.Inspector
	client *asynq.Client
	store  *jobs.Store
}

func newRequeueFixture(t *testing.T) *requeueFixture {
	t.Helper()
	db := jobstest.New(t)
	rdb := e2eRedis(t)
	f := &requeueFixture{db: db, rdb: rdb, q: "requeue_" + db.Schema, insp: asynq.NewInspectorFromRedisClient(rdb),
		client: asynq.NewClientFromRedisClient(rdb), store: db.Store()}
	t.Cleanup(func() { _ = queuetest.Remove(context.Background(), rdb, f.q) })
	db.JobType(t, "report.export", "30 minutes", "", "6 hours")
	return f
}

func (f *requeueFixture) args(extra ...string) []string {
	return append([]string{"requeue", "--database-url", f.db.URL, "--schema", f.db.Schema, "--redis-url", e2eRedisURL}, extra...)
}

// enqueue inserts id QUEUED and enqueues its task with opts.
func (f *requeueFixture) enqueue(t *testing.T, id string, opts ...asynq.Option) {
	t.Helper()
	f.db.Insert(t, jobstest.Job{ID: id, Type: "report.export", Status: jobs.StatusQueued, Queue: f.q})
	if _, err := queue.Enqueue(t.Context(), f.client, f.store, asynq.NewTask("report.export", []byte(`{"report":"`+id+`"}`)), id, opts...); err != nil {
		t.Fatal(err)
	}
}

// reaped leaves id as a reap does: FAILED stalled at generation 1 with its
// marker, and its task archived by asynq (the guard refused a redelivery).
func (f *requeueFixture) reaped(t *testing.T, id string) {
	t.Helper()
	f.enqueue(t, id, asynq.Deadline(time.Now().Add(24*time.Hour)), asynq.MaxRetry(3))
	if err := f.insp.ArchiveTask(f.q, id); err != nil {
		t.Fatal(err)
	}
	f.db.Exec(t, `UPDATE jobs SET status = 'FAILED', failure_reason = 'stalled', generation = 1, worker = 'w-dead',
       started_at = now() - interval '31 minutes', finished_at = now(), marker_set_at = now() WHERE id = $1`, id)
	if _, err := asynqstate.NewMarkerWriter(f.rdb, 0).Set(t.Context(), id, 1, queue.MarkerTTL); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.rdb.Del(context.Background(), queue.MarkerKey(id)) })
}

// taskState returns the state of id's task, or "none".
func (f *requeueFixture) taskState(t *testing.T, id string) string {
	t.Helper()
	info, err := f.insp.GetTaskInfo(f.q, id)
	if err != nil {
		return "none"
	}
	return info.State.String()
}

func TestRequeue_ReapedJobRunsAgainToCompletionThroughTheGuard(t *testing.T) {
	t.Parallel()
	f := newRequeueFixture(t)
	id := f.q + "-J"
	f.reaped(t, id)

	r := run(t, f.args("--reason", "upstream fixed", "--output", "json", id)...)
	requireExit(t, r, exitOK)
	var line requeueLine
	if err := json.Unmarshal([]byte(r.stdout), &line); err != nil || strings.Count(r.stdout, "\n") != 1 {
		t.Fatalf("stdout %q is not one JSON line (%v)", r.stdout, err)
	}
	want := requeueLine{JobID: id, Outcome: outcomeRequeued, Queue: f.q, FromStatus: jobs.StatusFailed, TaskState: "archived",
		Message: fmt.Sprintf("FAILED -> QUEUED at generation 2; its archived task in queue %q was replaced by a new one", f.q)}
	if gen := line.Generation; gen == nil || *gen != 2 {
		t.Fatalf("line's generation = %v, want 2", gen)
	}
	if line.Generation = nil; line != want {
		t.Fatalf("line = %+v, want %+v", line, want)
	}
	if row := f.db.Read(t, id); row.Status != jobs.StatusQueued || row.Generation != 2 || row.FailureReason != "" || row.Finished {
		t.Fatalf("row after requeue = %+v, want QUEUED at generation 2 without failure", row)
	}
	info, err := f.insp.GetTaskInfo(f.q, id)
	if err != nil {
		t.Fatal(err)
	}
	if info.ID != id || info.State != asynq.TaskStatePending || info.Type != "report.export" ||
		string(info.Payload) != `{"report":"`+id+`"}` || !info.Deadline.IsZero() || info.Timeout != 6*time.Hour || info.MaxRetry != 3 {
		t.Fatalf("new task = id %s state %v type %s payload %s deadline %v timeout %v max retry %d; want the same ID, type and payload, "+
			"pending, no deadline, Timeout 6h (hard_timeout), MaxRetry 3", info.ID, info.State, info.Type, info.Payload, info.Deadline, info.Timeout, info.MaxRetry)
	}
	if n := f.db.Count(t, `SELECT count(*) FROM job_events WHERE job_id = $1 AND kind = 'requeued' AND generation = 2
   AND detail->>'reason' = 'upstream fixed' AND detail->>'task_state' = 'archived'`, id); n != 1 {
		t.Fatalf("requeued events carrying the reason = %d, want 1", n)
	}

	// A real worker with the start guard runs it to completion: the old
	// marker (generation 1) no longer refuses the job (generation 2).
	var ran atomic.Int32
	w := startWorker(t, f.db, f.rdb, f.q, "w-requeue", func(ctx context.Context, _ *asynq.Task) error {
		ran.Add(1)
		lease, err := jobs.LeaseFromContext(ctx)
		if err != nil {
			return err
		}
		_, err = f.store.CompleteWith(ctx, f.db.Pool, lease, nil)
		return err
	})
	t.Cleanup(w.srv.Shutdown)
	jobstest.Eventually(t, "the requeued job completes", func() bool {
		return f.db.Read(t, id).Status == jobs.StatusCompleted
	})
	if row := f.db.Read(t, id); row.Generation != 3 || ran.Load() != 1 {
		t.Fatalf("completed row generation %d (want 3: the worker's claim), handler runs %d (want 1)", row.Generation, ran.Load())
	}
	if g, err := f.rdb.Get(t.Context(), queue.MarkerKey(id)).Result(); err != nil || g != "1" {
		t.Fatalf("marker = %q (%v); the requeue must leave the reap's marker (generation 1) to expire", g, err)
	}

	// Safe to run twice: the job is COMPLETED now, so a second requeue is
	// refused and changes nothing.
	before := f.db.Read(t, id)
	r = run(t, f.args("--reason", "again", id)...)
	requireExit(t, r, exitPassErrors)
	if !strings.HasPrefix(r.stdout, "refused "+idcheck.QuoteID(id)+": it is COMPLETED") || f.db.Read(t, id) != before {
		t.Fatalf("second requeue: stdout %q, row %+v (before %+v)", r.stdout, f.db.Read(t, id), before)
	}
}

func TestRequeue_RefusalsExitOneAndChangeNothing(t *testing.T) {
	t.Parallel()
	f := newRequeueFixture(t)
	id := func(s string) string { return f.q + "-" + s }

	f.db.Insert(t, jobstest.Job{ID: id("processing"), Type: "report.export", Queue: f.q, Generation: 1,
		StartedAgo: jobstest.Ago(time.Hour), IdleAgo: time.Hour})
	f.db.Insert(t, jobstest.Job{ID: id("completed"), Type: "report.export", Status: jobs.StatusCompleted, Queue: f.q, Generation: 1})
	f.enqueue(t, id("pending"))
	f.enqueue(t, id("scheduled"), asynq.ProcessIn(time.Hour))
	// Reaped, but asynq holds no task at all (the enqueue failed after the
	// row was committed, or the archived task was deleted).
	f.db.Insert(t, jobstest.Job{ID: id("taskless"), Type: "report.export", Status: jobs.StatusFailed, Queue: f.q, Generation: 1})
	// A reaped job requeued a first time: its task is pending now.
	f.reaped(t, id("twice"))
	requireExit(t, run(t, f.args("--reason", "first", id("twice"))...), exitOK)

	cases := map[string]string{
		id("unknown"):    "no job has this ID",
		id("processing"): "it is PROCESSING",
		id("completed"):  "it is COMPLETED",
		id("pending"):    "asynq holds its task pending",
		id("scheduled"):  "asynq holds its task scheduled",
		id("taskless"):   "the product must enqueue the job again",
		id("twice"):      "asynq holds its task pending",
	}
	type state struct {
		row    jobstest.Row
		task   string
		events int64
	}
	snapshot := func(j string) state {
		if j == id("unknown") {
			return state{task: f.taskState(t, j)}
		}
		return state{f.db.Read(t, j), f.taskState(t, j), f.db.Count(t, `SELECT count(*) FROM job_events WHERE job_id = $1`, j)}
	}
	for j, why := range cases {
		before := snapshot(j)
		r := run(t, f.args("--reason", "try", j)...)
		requireExit(t, r, exitPassErrors)
		if !strings.HasPrefix(r.stdout, "refused "+idcheck.QuoteID(j)+": ") || !strings.Contains(r.stdout, why) || strings.Count(r.stdout, "\n") != 1 {
			t.Errorf("%s: stdout %q, want one line refusing it because %s", j, r.stdout, why)
		}
		if after := snapshot(j); after != before {
			t.Errorf("%s changed: %+v -> %+v", j, before, after)
		}
	}

	// Several jobs: each gets its line, and one refusal makes exit 1 while
	// the others are requeued.
	f.reaped(t, id("ok"))
	r := run(t, f.args("--reason", "batch", "--output", "json", id("unknown"), id("ok"))...)
	requireExit(t, r, exitPassErrors)
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if len(lines) != 2 || !strings.Contains(lines[0], `"outcome":"refused"`) || !strings.Contains(lines[1], `"outcome":"requeued"`) {
		t.Fatalf("stdout = %q, want a refused line then a requeued line", r.stdout)
	}
	if row := f.db.Read(t, id("ok")); row.Status != jobs.StatusQueued || row.Generation != 2 {
		t.Fatalf("the job that could be requeued = %+v", row)
	}
}

func TestRequeue_UsageErrorsExitTwo(t *testing.T) {
	t.Parallel()
	db := jobstest.New(t)
	base := []string{"requeue", "--database-url", db.URL, "--schema", db.Schema, "--redis-url", e2eRedisURL}
	for args, want := range map[string][]string{
		"J1":                             {"--reason is required"},
		"--reason x":                     {"give the IDs of the jobs to requeue, or --stale"},
		"--reason x --stale J1":          {"not both"},
		"--reason x --stale-after 2h J1": {"--stale-after applies to --stale only"},
	} {
		r := run(t, append(base, strings.Fields(args)...)...)
		requireExit(t, r, exitCannotRun)
		requireOneLineError(t, r, want...)
	}
}
