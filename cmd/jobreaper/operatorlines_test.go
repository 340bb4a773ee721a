package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/jobreaper/jobreaper/internal/asynqstate"
	"github.com/jobreaper/jobreaper/internal/idcheck"
	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
	"github.com/jobreaper/jobreaper/queue"
)

// decodeLines decodes stdout as one JSON object per line into T, strictly.
func decodeLines[T any](t *testing.T, stdout string) []T {
	t.Helper()
	var out []T
	for _, l := range strings.Split(strings.TrimSuffix(stdout, "\n"), "\n") {
		var v T
		dec := json.NewDecoder(strings.NewReader(l))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&v); err != nil {
			t.Fatalf("line %q is not one JSON object of the command's output: %v", l, err)
		}
		out = append(out, v)
	}
	return out
}

// genOf returns *g, or -1 when g is nil.
func genOf(g *int64) int64 {
	if g == nil {
		return -1
	}
	return *g
}

// A reaped job whose task waits in asynq's retry set (here after a cancel,
// which makes asynq schedule a retry of the cancelled handler's task) is
// refused with what to do instead of a guess, and --replace-waiting
// requeues it at once, with the type's on_requeued cascade resetting the
// product's status in the requeue's transaction.
func TestRequeue_JobWhoseTaskWaitsInRetry(t *testing.T) {
	t.Parallel()
	f := newRequeueFixture(t)
	id := f.q + "-J waiting"
	f.db.Exec(t, `CREATE TABLE exports (id text PRIMARY KEY, status text NOT NULL)`)
	f.db.Exec(t, `INSERT INTO exports VALUES ('E1', 'RUNNING')`)
	table := f.db.Table("exports")
	file := filepath.Join(t.TempDir(), "jobreaper.yaml")
	if err := os.WriteFile(file, []byte(`cascades:
  report.export:
    on_failed: UPDATE `+table+` SET status = 'FAILED' WHERE id = @parent_id
    on_requeued: UPDATE `+table+` SET status = 'RUNNING' WHERE id = @parent_id
`), 0o600); err != nil {
		t.Fatal(err)
	}
	f.db.Insert(t, jobstest.Job{ID: id, Type: "report.export", Status: jobs.StatusQueued, Queue: f.q, ParentID: "E1"})
	if _, err := queue.Enqueue(t.Context(), f.client, f.store, asynq.NewTask("report.export", []byte(`{"n":1}`)), id); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.rdb.Del(context.Background(), queue.MarkerKey(id)) })
	running := make(chan struct{}, 1)
	w := startWorker(t, f.db, f.rdb, f.q, "w-retry", func(ctx context.Context, _ *asynq.Task) error {
		running <- struct{}{}
		<-ctx.Done()
		return ctx.Err()
	})
	t.Cleanup(w.srv.Shutdown)
	select {
	case <-running:
	case <-time.After(30 * time.Second):
		t.Fatal("the handler did not start within 30s")
	}

	r := run(t, opsArgs(f.db, "cancel", "--config", file, "--output", "json", "--reason", "stuck", id)...)
	requireExit(t, r, exitOK)
	cancelled := decodeLines[cancelLine](t, r.stdout)
	if len(cancelled) != 1 || cancelled[0].Outcome != outcomeCancelled || cancelled[0].TaskState != "active" ||
		cancelled[0].Handler != handlerCancelSent || cancelled[0].Marker != markerSet || genOf(cancelled[0].Generation) != 1 {
		t.Fatalf("cancel lines = %+v", cancelled)
	}
	// asynq stops the cancelled handler and schedules a retry (15 s or
	// more ahead, asynq's default delay), which stays waiting once the
	// worker is gone.
	jobstest.Eventually(t, "the cancelled task waits in retry", func() bool { return f.taskState(t, id) == "retry" })
	w.srv.Shutdown()
	if n := f.db.Count(t, `SELECT count(*) FROM exports WHERE status = 'FAILED'`); n != 1 {
		t.Fatal("the on_failed cascade of the cancel did not fail the export")
	}

	before := f.db.Read(t, id)
	r = run(t, f.args("--config", file, "--output", "json", "--reason", "try", id)...)
	requireExit(t, r, exitPassErrors)
	refused := decodeLines[requeueLine](t, r.stdout)
	if len(refused) != 1 || refused[0].Outcome != outcomeRefused || refused[0].TaskState != "retry" ||
		genOf(refused[0].Generation) != 1 || refused[0].FromStatus != jobs.StatusFailed ||
		!strings.Contains(refused[0].Message, "asynq holds its task retry in queue") ||
		!strings.Contains(refused[0].Message, "the start guard refuses that delivery (the job is FAILED) and asynq then archives the task") ||
		!strings.Contains(refused[0].Message, "--replace-waiting") || strings.Contains(refused[0].Message, "already requeued") {
		t.Fatalf("requeue of a job whose task waits in retry: %+v", refused)
	}
	if f.db.Read(t, id) != before || f.taskState(t, id) != "retry" {
		t.Fatalf("the refused requeue changed the job or its task: %+v, task %s", f.db.Read(t, id), f.taskState(t, id))
	}

	r = run(t, f.args("--config", file, "--replace-waiting", "--reason", "upstream fixed", id)...)
	requireExit(t, r, exitOK)
	if want := "requeued " + idcheck.QuoteID(id) + ": FAILED -> QUEUED at generation 2; its retry task in queue \"" + f.q + "\" was replaced by a new one\n"; r.stdout != want {
		t.Fatalf("stdout = %q, want %q", r.stdout, want)
	}
	if row := f.db.Read(t, id); row.Status != jobs.StatusQueued || row.Generation != 2 {
		t.Fatalf("row = %+v, want QUEUED at generation 2", row)
	}
	info, err := f.insp.GetTaskInfo(f.q, id)
	if err != nil || info.State != asynq.TaskStatePending || string(info.Payload) != `{"n":1}` {
		t.Fatalf("task after --replace-waiting = %+v (%v), want a pending task with the same payload", info, err)
	}
	if n := f.db.Count(t, `SELECT count(*) FROM job_events WHERE job_id = $1 AND kind = 'requeued'
   AND detail->>'task_state' = 'retry' AND (detail->>'replaced_waiting')::boolean`, id); n != 1 {
		t.Fatalf("requeued events recording the replaced waiting task = %d, want 1", n)
	}
	if n := f.db.Count(t, `SELECT count(*) FROM exports WHERE id = 'E1' AND status = 'RUNNING'`); n != 1 {
		t.Fatal("the on_requeued cascade did not reset the export's status")
	}
}

// Refusals are lines of the command's output like any other: on stdout,
// carrying the task's state and the job's generation in their JSON.
func TestOperatorRefusalsCarryTaskStateAndGeneration(t *testing.T) {
	t.Parallel()
	f := newRequeueFixture(t)
	done, pending := f.q+"-done", f.q+"-pending"
	f.db.Insert(t, jobstest.Job{ID: done, Type: "report.export", Status: jobs.StatusCompleted, Queue: f.q, Generation: 3})
	f.enqueue(t, pending)

	r := run(t, f.args("--output", "json", "--reason", "x", done, pending, f.q+"-unknown")...)
	requireExit(t, r, exitPassErrors)
	lines := decodeLines[requeueLine](t, r.stdout)
	if len(lines) != 3 ||
		lines[0].Outcome != outcomeRefused || lines[0].FromStatus != jobs.StatusCompleted || lines[0].TaskState != "not_found" || genOf(lines[0].Generation) != 3 ||
		lines[1].Outcome != outcomeRefused || lines[1].FromStatus != jobs.StatusQueued || lines[1].TaskState != "pending" || genOf(lines[1].Generation) != 0 ||
		lines[2].Outcome != outcomeRefused || lines[2].Generation != nil || lines[2].TaskState != "" {
		t.Fatalf("requeue refusals = %+v", lines)
	}
	if !strings.Contains(r.stderr, "3 job(s) not requeued") {
		t.Fatalf("stderr = %q", r.stderr)
	}

	r = run(t, opsArgs(f.db, "cancel", "--output", "json", "--reason", "x", done, f.q+"-unknown")...)
	requireExit(t, r, exitPassErrors)
	cl := decodeLines[cancelLine](t, r.stdout)
	if len(cl) != 2 ||
		cl[0].Outcome != outcomeRefused || cl[0].FromStatus != jobs.StatusCompleted || cl[0].TaskState != "not_found" || genOf(cl[0].Generation) != 3 ||
		cl[0].Queue != f.q || cl[0].Message != "it is COMPLETED; only a QUEUED or PROCESSING job can be cancelled" ||
		cl[1].Outcome != outcomeRefused || cl[1].Generation != nil {
		t.Fatalf("cancel refusals = %+v", cl)
	}
}

// cancel says when there is no running handler to cancel, and then sends
// no cancel; and a job ID with a space is quoted in every text line.
func TestCancelWithoutARunningHandler(t *testing.T) {
	t.Parallel()
	f := newRequeueFixture(t)
	pending, taskless := f.q+"-J pending", f.q+"-J\ttaskless"
	f.enqueue(t, pending)
	f.db.Insert(t, jobstest.Job{ID: taskless, Type: "report.export", Status: jobs.StatusQueued, Queue: f.q})
	t.Cleanup(func() { f.rdb.Del(context.Background(), queue.MarkerKey(pending), queue.MarkerKey(taskless)) })
	sub := f.rdb.Subscribe(t.Context(), asynqstate.CancelChannel)
	t.Cleanup(func() { _ = sub.Close() })
	if _, err := sub.Receive(t.Context()); err != nil { // the subscription's confirmation
		t.Fatal(err)
	}

	r := run(t, opsArgs(f.db, "cancel", "--reason", "not needed", pending, taskless)...)
	requireExit(t, r, exitOK)
	want := "cancelled job " + idcheck.QuoteID(pending) + " (was QUEUED, generation 0): marker set, no running handler to cancel (asynq holds its task pending)\n" +
		"cancelled job " + idcheck.QuoteID(taskless) + " (was QUEUED, generation 0): marker set, no running handler to cancel (asynq holds no task for it)\n"
	if r.stdout != want {
		t.Fatalf("stdout = %q, want %q", r.stdout, want)
	}
	if !strings.Contains(r.stdout, `"`+f.q+`-J pending"`) || !strings.Contains(r.stdout, `"`+f.q+`-J\ttaskless"`) {
		t.Fatalf("the IDs are not quoted: %q", r.stdout)
	}
	// Redis delivers a channel's messages in the order they were
	// published: a sentinel published after the command arrives first
	// only when the command published no cancel.
	const sentinel = "sentinel-after-the-command"
	if err := f.rdb.Publish(t.Context(), asynqstate.CancelChannel, sentinel).Err(); err != nil {
		t.Fatal(err)
	}
	for {
		msg, err := sub.ReceiveMessage(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if msg.Payload == sentinel {
			break
		}
		if msg.Payload == pending || msg.Payload == taskless {
			t.Fatalf("a cancel was published for %q, which had no running handler", msg.Payload)
		}
	}
	for _, id := range []string{pending, taskless} {
		if row := f.db.Read(t, id); row.Status != jobs.StatusFailed || row.FailureReason != jobs.ReasonCancelled {
			t.Fatalf("%s = %+v, want FAILED cancelled", id, row)
		}
	}

	// requeue quotes the ID in its text lines too.
	r = run(t, f.args("--reason", "x", taskless)...)
	requireExit(t, r, exitPassErrors)
	if !strings.HasPrefix(r.stdout, "refused "+`"`+f.q+`-J\ttaskless": asynq holds no task for it`) {
		t.Fatalf("requeue's line = %q", r.stdout)
	}
}
