package queue

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/jobreaper/jobreaper/config"
	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
)

// shortDeadlineLines returns the guard's short-deadline warnings in logs.
func shortDeadlineLines(logs string) []string {
	var out []string
	for _, l := range strings.Split(logs, "\n") {
		if strings.Contains(l, "reason=short_deadline") {
			out = append(out, l)
		}
	}
	return out
}

// shortDeadlines returns jobreaper_guard_short_deadline_total{type=typ}.
func shortDeadlines(t *testing.T, reg *prometheus.Registry, typ string) float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range families {
		if mf.GetName() != "jobreaper_guard_short_deadline_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			if m.GetLabel()[0].GetValue() == typ {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

// The guard's stall timeout for types without their own is the daemon's
// default unless WithStallTimeout says otherwise.
func TestGuardStallTimeoutDefaultIsTheDaemons(t *testing.T) {
	t.Parallel()
	if g := NewGuard(nil, nil); g.stallTimeout != config.StallTimeoutDefault {
		t.Fatalf("default stall timeout = %s, want config.StallTimeoutDefault %s", g.stallTimeout, config.StallTimeoutDefault)
	}
	for d, want := range map[time.Duration]time.Duration{
		5 * time.Second: 5 * time.Second, 0: config.StallTimeoutDefault, -time.Second: config.StallTimeoutDefault,
	} {
		if g := NewGuard(nil, nil, WithStallTimeout(d)); g.stallTimeout != want {
			t.Errorf("WithStallTimeout(%s): stall timeout %s, want %s", d, g.stallTimeout, want)
		}
	}
}

// At the claim the guard compares the handler context's deadline with
// started_at + max_runtime + stall timeout (the type's own, else the
// guard's), warns once per type and counts every such claim per type; the
// handler runs as before.
func TestGuardWarnsOfADeadlineShorterThanTheReapersRule(t *testing.T) {
	t.Parallel()
	b := setupGuard(t)
	b.db.JobType(t, "short.default", "20 seconds", "", "")
	b.db.JobType(t, "short.own", "20 seconds", "7 seconds", "")
	b.db.JobType(t, "long.enough", "20 seconds", "7 seconds", "")
	b.db.Exec(t, `UPDATE job_types SET auto_complete = true`)
	var logs jobstest.SyncBuffer
	g := NewGuard(b.store, b.markers, WithWorker("W1"), WithRegisterer(b.reg), WithStallTimeout(5*time.Second),
		WithLogger(slog.New(slog.NewTextHandler(io.MultiWriter(&logs, tWriter{t}), nil))))
	g.taskID = testTaskID
	run := func(id, typ string, timeout time.Duration) {
		t.Helper()
		b.db.Insert(t, jobstest.Job{ID: id, Type: typ, Status: jobs.StatusQueued})
		ctx := t.Context()
		if timeout > 0 {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, timeout)
			defer cancel()
		}
		h := &recorder{}
		err := deliver(ctx, g, id, h)
		if h.runs() != 1 || (err != nil && typ != "unknown.type") {
			t.Fatalf("%s: guard returned %v after %d runs, want the handler run once", id, err, h.runs())
		}
	}
	run("a1", "short.default", 10*time.Second) // 10 s < 20 s + 5 s (the guard's)
	run("a2", "short.default", 10*time.Second)
	run("b1", "short.own", 26*time.Second)     // 26 s < 20 s + 7 s (the type's own)
	run("c1", "long.enough", 10*time.Minute)   // 10 min > 27 s
	run("c2", "long.enough", 0)                // no deadline
	run("u1", "unknown.type", 10*time.Second)  // no job_types row: nothing to compare (and no auto_complete)
	run("r1", "report.export", 10*time.Minute) // 10 min < 30 min + 5 s

	lines := shortDeadlineLines(logs.String())
	if len(lines) != 3 {
		t.Fatalf("short-deadline warnings:\n%s\nwant 3 (one per type)", strings.Join(lines, "\n"))
	}
	for i, want := range []string{
		"type=short.default max_runtime=20s stall_timeout=5s stall_timeout_from=guard",
		"type=short.own max_runtime=20s stall_timeout=7s stall_timeout_from=job_types",
		"type=report.export max_runtime=30m0s stall_timeout=5s",
	} {
		if !strings.Contains(lines[i], "level=WARN") || !strings.Contains(lines[i], want) || !strings.Contains(lines[i], "deadline=") {
			t.Errorf("warning %d = %q, want a WARN with %q and the deadline", i, lines[i], want)
		}
	}
	for typ, want := range map[string]float64{"short.default": 2, "short.own": 1, "long.enough": 0, "unknown.type": 0, "report.export": 1} {
		if got := shortDeadlines(t, b.reg, typ); got != want {
			t.Errorf("jobreaper_guard_short_deadline_total{type=%q} = %v, want %v", typ, got, want)
		}
	}
}

// A type name that cannot be a label value (here longer than
// jobs.MaxIDLength) is counted under type="".
func TestGuardShortDeadlineOfATypeWhoseNameCannotBeALabel(t *testing.T) {
	t.Parallel()
	b := setupGuard(t)
	long := strings.Repeat("t", jobs.MaxIDLength+1)
	b.db.JobType(t, long, "20 seconds", "", "")
	b.db.Exec(t, `UPDATE job_types SET auto_complete = true`)
	g := b.guard(t, "W1", nil, nil)
	b.db.Insert(t, jobstest.Job{ID: "J1", Type: long, Status: jobs.StatusQueued})
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if err := deliver(ctx, g, "J1", &recorder{}); err != nil {
		t.Fatal(err)
	}
	if got := shortDeadlines(t, b.reg, ""); got != 1 {
		t.Fatalf(`jobreaper_guard_short_deadline_total{type=""} = %v, want 1`, got)
	}
	if got := shortDeadlines(t, b.reg, long); got != 0 {
		t.Fatalf("the over-long type name became a label value")
	}
}

// TestCase_B50_ATaskWhoseDeadlineEndsBeforeTheReaperCanAct: a producer
// enqueues with plain asynq Timeout(3s) a job whose type has max_runtime
// 20 s. At the claim the worker logs one warning naming the type, the
// task's deadline, max_runtime and the stall timeout, and counts it for
// the type; a second task of the type adds to the count without a second
// warning. Both tasks run as before. Real PostgreSQL, Redis and asynq.
func TestCase_B50_ATaskWhoseDeadlineEndsBeforeTheReaperCanAct(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := jobstest.New(t)
	db.JobType(t, "report.render", "20 seconds", "", "")
	db.Exec(t, `UPDATE job_types SET auto_complete = true`)
	store := db.Store()
	rc := realRedis(t)
	q := unique(t, "b50-")
	deleteQueueAtCleanup(t, rc, q)
	markers, err := NewMarkerStore(rc)
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	var logs jobstest.SyncBuffer
	guard := NewGuard(store, markers, WithWorker("W1"), WithRegisterer(reg),
		WithLogger(slog.New(slog.NewTextHandler(io.MultiWriter(&logs, tWriter{t}), nil))))
	type ran struct {
		id       string
		deadline time.Time
	}
	runs := make(chan ran, 2)
	mux := asynq.NewServeMux()
	mux.Use(guard.Middleware())
	mux.HandleFunc("report.render", func(ctx context.Context, _ *asynq.Task) error {
		lease, err := jobs.LeaseFromContext(ctx)
		if err != nil {
			return err
		}
		d, _ := ctx.Deadline()
		runs <- ran{lease.JobID, d}
		return nil
	})
	startServer(t, rc, q, asynq.Config{IsFailure: IsFailure}, mux)
	client := asynq.NewClientFromRedisClient(rc)
	t.Cleanup(func() { _ = client.Close() })

	next := func(id string) ran {
		t.Helper()
		db.Insert(t, jobstest.Job{ID: id, Type: "report.render", Status: jobs.StatusQueued, Queue: q})
		enqueued := time.Now()
		// Plain asynq, as a producer that does not use queue.Enqueue.
		if _, err := client.EnqueueContext(ctx, asynq.NewTask("report.render", nil), asynq.TaskID(id), asynq.Queue(q), asynq.Timeout(3*time.Second)); err != nil {
			t.Fatal(err)
		}
		select {
		case r := <-runs:
			if r.id != id || r.deadline.Before(enqueued) || r.deadline.After(time.Now().Add(3*time.Second)) {
				t.Fatalf("handler ran %s with deadline %v, want %s with a deadline within 3 s of its start", r.id, r.deadline, id)
			}
			return r
		case <-time.After(30 * time.Second):
			t.Fatalf("%s did not run within 30 s", id)
		}
		return ran{}
	}

	first := next("B50-1")
	jobstest.Eventually(t, "B50-1 completes", func() bool { return db.Read(t, "B50-1").Status == jobs.StatusCompleted })
	lines := shortDeadlineLines(logs.String())
	if len(lines) != 1 {
		t.Fatalf("short-deadline warnings after the first task: %q, want 1", lines)
	}
	for _, want := range []string{"level=WARN", "type=report.render", "max_runtime=20s", "stall_timeout=15m0s", "job_id=B50-1"} {
		if !strings.Contains(lines[0], want) {
			t.Fatalf("warning %q does not say %q", lines[0], want)
		}
	}
	_, value, _ := strings.Cut(lines[0], "deadline=")
	value, _, _ = strings.Cut(value, " ")
	logged, err := time.Parse(time.RFC3339, value)
	if err != nil || logged.Sub(first.deadline).Abs() > time.Millisecond {
		t.Fatalf("warning's deadline %q (%v), want the handler's deadline %v", value, err, first.deadline)
	}
	if got := shortDeadlines(t, reg, "report.render"); got != 1 {
		t.Fatalf("jobreaper_guard_short_deadline_total{type=report.render} = %v, want 1", got)
	}

	next("B50-2")
	jobstest.Eventually(t, "B50-2 completes", func() bool { return db.Read(t, "B50-2").Status == jobs.StatusCompleted })
	if lines := shortDeadlineLines(logs.String()); len(lines) != 1 {
		t.Fatalf("short-deadline warnings after the second task: %q, want still 1", lines)
	}
	if got := shortDeadlines(t, reg, "report.render"); got != 2 {
		t.Fatalf("jobreaper_guard_short_deadline_total{type=report.render} = %v, want 2", got)
	}
	if v := testutil.ToFloat64(newGuardMetrics(reg).decisions.WithLabelValues("claimed")); v != 2 {
		t.Fatalf("claimed = %v, want 2", v)
	}
}
