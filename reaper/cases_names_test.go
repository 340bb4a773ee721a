package reaper_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/jobreaper/jobreaper/internal/asynqstate"
	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
	"github.com/jobreaper/jobreaper/queue/queuetest"
	"github.com/jobreaper/jobreaper/reaper"
)

// Queue names no PostgreSQL text value or Prometheus label can hold, as
// other clients sharing the Redis can put them into asynq:queues.
const (
	// invalidUTF8Queue is SADDed by hand: Prometheus refuses it as a label
	// value (WithLabelValues panics).
	invalidUTF8Queue = "bad\xffqueue"
	// nulQueue is what asynq's own client adds when a producer enqueues
	// into asynq.Queue("tenant\x00eu"): PostgreSQL text cannot hold it, so
	// an array of queue names holding it fails the whole statement.
	nulQueue = "tenant\x00eu"
)

// namesFixture is a Redis of the test's own holding J42a, a stalled job
// whose task is active in q42a, and J42b, a stalled job of queue served
// (a live asynq server serves it) whose task asynq archived.
func namesFixture(t *testing.T) *ownRedis {
	t.Helper()
	o := newOwnRedis(t)
	o.db.Insert(t, stalledJob("J42a", "q42a"))
	if err := queuetest.MakeActive(t.Context(), o.rc, "q42a", "report.export", []string{"J42a"}); err != nil {
		t.Fatal(err)
	}
	stalledRows(t, o.db, "served", time.Hour, "J42b")
	archived(t, o.rc, "served", "J42b")
	serve(t, o.rc, []string{"served"}, func(context.Context, *asynq.Task) error { return nil }, asynq.Config{})
	waitLive(t, o.rc, "served")
	return o
}

// addInvalidUTF8Queue SADDs invalidUTF8Queue, as any Redis client can.
func addInvalidUTF8Queue(t *testing.T, o *ownRedis) {
	t.Helper()
	if err := o.rc.SAdd(t.Context(), "asynq:queues", invalidUTF8Queue).Err(); err != nil {
		t.Fatal(err)
	}
}

// addNULQueue enqueues a task into nulQueue through asynq's own client,
// which adds the name to asynq:queues for good.
func addNULQueue(t *testing.T, o *ownRedis) {
	t.Helper()
	if _, err := asynq.NewClientFromRedisClient(o.rc).EnqueueContext(t.Context(), asynq.NewTask("tenant.sync", nil),
		asynq.Queue(nulQueue)); err != nil {
		t.Fatalf("asynq refused a queue name with a NUL byte: %v", err)
	}
	if ok, err := o.rc.SIsMember(t.Context(), "asynq:queues", nulQueue).Result(); err != nil || !ok {
		t.Fatalf("asynq:queues holds %q: %v, %v; want true", nulQueue, ok, err)
	}
}

// requireNamesReaped fails unless J42a was reaped as stalled and J42b as
// lost_task.
func requireNamesReaped(t *testing.T, o *ownRedis) {
	t.Helper()
	for id, reason := range map[string]string{"J42a": jobs.ReasonStalled, "J42b": jobs.ReasonLostTask} {
		if row := o.db.Read(t, id); row.Status != jobs.StatusFailed || row.FailureReason != reason {
			t.Fatalf("%s = %+v, want FAILED %s", id, row, reason)
		}
	}
}

// stalledJob is a PROCESSING job of q claimed 31 min ago and idle for 21:
// stalled under report.export's 30 min and the baseline stall timeout.
func stalledJob(id, q string) jobstest.Job {
	return jobstest.Job{ID: id, Type: "report.export", Generation: 1, Queue: q,
		StartedAgo: jobstest.Ago(31 * time.Minute), IdleAgo: 21 * time.Minute}
}

// One asynq:queues member that is not valid UTF-8 used to reach a metric
// label and panic every pass; it is skipped, and the others are scanned.
func TestQueueNameOfInvalidUTF8IsSkippedNotAPanic(t *testing.T) {
	t.Parallel()
	o := namesFixture(t)
	addInvalidUTF8Queue(t, o)
	res, err := runOnce(t, t.Context(), o.lostReaper(t, o.rc, func(opts *reaper.Options) { opts.Once = true }))
	if err != nil || res.Errors != 0 || res.ReapedBy[jobs.ReasonStalled] != 1 || res.ReapedBy[jobs.ReasonLostTask] != 1 {
		t.Fatalf("pass = %+v, %v; want J42a stalled, J42b lost_task, no error", res, err)
	}
	requireNamesReaped(t, o)
}

// One queue name holding a NUL byte used to fail the lost-task search's
// statement (SQLSTATE 22021) every pass, so no lost_task of any queue was
// reaped; it is skipped, and the lost task of the served queue is reaped.
func TestQueueNameWithANULByteDoesNotStopLostTaskReaps(t *testing.T) {
	t.Parallel()
	o := namesFixture(t)
	addNULQueue(t, o)
	res, err := runOnce(t, t.Context(), o.lostReaper(t, o.rc, func(opts *reaper.Options) { opts.Once = true }))
	if err != nil || res.Errors != 0 || res.ReapedBy[jobs.ReasonStalled] != 1 || res.ReapedBy[jobs.ReasonLostTask] != 1 {
		t.Fatalf("pass = %+v, %v; want J42a stalled, J42b lost_task, no error", res, err)
	}
	requireNamesReaped(t, o)
}

// B42: some client SADDs "bad\xffqueue" and asynq's own client enqueues
// into "tenant\x00eu"; the daemon scans every queue. Both names are
// skipped for the pass, counted and warned about (quoted) once per
// process; J42a is reaped stalled and J42b lost_task; no pass panics or
// errors because of them.
func TestCase_B42_QueueNamesNoTextOrLabelCanHold(t *testing.T) {
	t.Parallel()
	o := namesFixture(t)
	addInvalidUTF8Queue(t, o)
	addNULQueue(t, o)
	r := o.lostReaper(t, o.rc, func(opts *reaper.Options) { opts.Once = true })

	res, err := runOnce(t, t.Context(), r)
	if err != nil || res.Errors != 0 || res.BadQueueNames != 2 || res.ReapedBy[jobs.ReasonStalled] != 1 ||
		res.ReapedBy[jobs.ReasonLostTask] != 1 {
		t.Fatalf("pass = %+v, %v; want J42a stalled, J42b lost_task, bad_queue_names 2, no error", res, err)
	}
	requireNamesReaped(t, o)
	if got := metricValue(t, o.reg, "jobreaper_bad_queue_names", nil); got != 2 {
		t.Fatalf("jobreaper_bad_queue_names = %v, want 2", got)
	}
	// Quoted (%q): the log line stays one readable line. The text handler
	// escapes the quoted name's backslash once more.
	for _, quoted := range []string{`bad\\xffqueue`, `tenant\\x00eu`} {
		if n := o.logs.count(quoted); n == 0 {
			t.Fatalf("no warning shows %s quoted", quoted)
		}
	}
	warned := o.logs.count("queue skipped: its name cannot be")
	if warned != 2 {
		t.Fatalf("%d warnings about bad queue names, want 2 (one per name)", warned)
	}

	// The next pass counts them again, and warns no more.
	res, err = runOnce(t, t.Context(), r)
	if err != nil || res.Errors != 0 || res.BadQueueNames != 2 {
		t.Fatalf("second pass = %+v, %v; want bad_queue_names 2 and no error", res, err)
	}
	if n := o.logs.count("queue skipped: its name cannot be"); n != warned {
		t.Fatalf("%d warnings after the second pass, want still %d: each name is warned about once", n, warned)
	}
	if got := metricValue(t, o.reg, "jobreaper_bad_queue_names", nil); got != 2 {
		t.Fatalf("jobreaper_bad_queue_names = %v after the second pass, want 2 (the last pass's count)", got)
	}
	// Every series gathers: no label holds what a label cannot.
	if _, err := o.reg.Gather(); err != nil {
		t.Fatalf("gathering the metrics: %v", err)
	}
}

// A job type or a queue read from PostgreSQL that cannot be a label value
// (over 1,024 bytes here; PostgreSQL text holds no NUL and, in a UTF8
// database, nothing but UTF-8) is counted under the label "(invalid)" of
// jobreaper_jobs_reaped_total, never dropped.
func TestReapOfATypeNoLabelCanHoldIsCountedUnderInvalid(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("t", jobs.MaxIDLength+1)
	b := setup(t)
	b.db.JobType(t, long, "30 minutes", "", "")
	b.db.Insert(t, jobstest.Job{ID: "J1", Type: long, Generation: 1, Queue: "default",
		StartedAgo: jobstest.Ago(31 * time.Minute), IdleAgo: 21 * time.Minute})
	b.lister.queues["default"] = asynqstate.ActiveTasks{IDs: []string{"J1"}}
	res, err := runOnce(t, t.Context(), b.reaper)
	if err != nil || res.Reaped != 1 {
		t.Fatalf("pass = %+v, %v; want J1 reaped", res, err)
	}
	labels := map[string]string{"reason": "stalled", "type": "(invalid)", "queue": "default"}
	if got := metricValue(t, b.reg, "jobreaper_jobs_reaped_total", labels); got != 1 {
		t.Fatalf("jobreaper_jobs_reaped_total%v = %v, want 1", labels, got)
	}
}
