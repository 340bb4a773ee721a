package main

import (
	"context"
	"syscall"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/jobreaper/jobreaper/internal/asynqstate"
	"github.com/jobreaper/jobreaper/internal/fleettest"
	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
	"github.com/jobreaper/jobreaper/queue"
	"github.com/jobreaper/jobreaper/queue/redistest"
)

// The dead-early tests' timings. asynq v0.26.0: a task's lease lasts 30 s
// and is extended by its server's heartbeat; the recoverer of every live
// server runs once a minute and archives (last attempt) the tasks whose
// lease expired at least 30 s before, so a task is archived within about
// 2 min of its worker's death; a server's registry entry lives two
// heartbeats (10 s) past its last one. The daemon passes every second
// with a stall timeout of 8 s for the long types.
const (
	deadEarlyStall    = 8 * time.Second
	deadEarlyInterval = time.Second
	// asynqArchiveWithin bounds asynq's archiving after a worker's death
	// or cut, with a 4x margin over its 2 min (a 10x margin would be 20
	// min; the bound only ends a test that is failing anyway).
	asynqArchiveWithin = 8 * time.Minute
	// deadEarlyWithin is the bound the issue sets, stall timeout + two
	// intervals, with a 10x margin.
	deadEarlyWithin = 10 * (deadEarlyStall + 2*deadEarlyInterval)
)

// deadEarlyFleet is one test's schema, its own Redis, an asynq server of
// the test's own that serves the queue (its recoverer archives the tasks
// of a dead worker), and a daemon.
type deadEarlyFleet struct {
	t      *testing.T
	db     *jobstest.DB
	redis  *redistest.Server
	rdb    *redis.Client
	q      string
	daemon *fleettest.Daemon
	state  *asynqstate.StatusReader
}

func newDeadEarlyFleet(t *testing.T) *deadEarlyFleet {
	t.Helper()
	db := jobstest.New(t)
	srv := redistest.Start(t)
	f := &deadEarlyFleet{t: t, db: db, redis: srv, rdb: srv.Client(t), q: "long"}
	f.state = asynqstate.NewStatusReader(f.rdb, 0)
	// Long types: max_runtime 2 h, a short stall timeout; one opted in.
	db.JobType(t, "video.encode", "2 hours", "8 seconds", "4 hours")
	db.Exec(t, `UPDATE job_types SET reap_dead_early = true WHERE name = 'video.encode'`)
	db.JobType(t, "video.plain", "2 hours", "8 seconds", "4 hours")
	return f
}

// startWorker starts a worker process whose guard names itself
// "<host>:<pid>", the default.
func (f *deadEarlyFleet) startWorker(name string, args ...string) *fleettest.Worker {
	f.t.Helper()
	return fleettest.StartWorker(f.t, fleettest.BuildWorker(f.t), fleettest.WorkerOptions{Name: name, DefaultName: true,
		DatabaseURL: f.db.URL, Schema: f.db.Schema, RedisURL: f.redis.URL, Queue: f.q, Args: args})
}

// enqueue inserts id QUEUED and enqueues its last (only) attempt.
func (f *deadEarlyFleet) enqueue(id, typ, payload string) {
	f.t.Helper()
	f.db.Insert(f.t, jobstest.Job{ID: id, Type: typ, Status: jobs.StatusQueued, Queue: f.q})
	if _, err := queue.Enqueue(f.t.Context(), asynq.NewClientFromRedisClient(f.rdb), f.db.Store(), asynq.NewTask(typ, []byte(payload)), id,
		asynq.MaxRetry(0)); err != nil {
		f.t.Fatal(err)
	}
}

// serveQueue starts the test's own asynq server of the queue; it takes no
// task while the workers hold theirs, and its recoverer archives the
// tasks whose lease expired.
func (f *deadEarlyFleet) serveQueue() {
	f.t.Helper()
	live := asynq.NewServerFromRedisClient(f.rdb, asynq.Config{Queues: map[string]int{f.q: 1}, LogLevel: asynq.FatalLevel})
	if err := live.Start(asynq.HandlerFunc(func(context.Context, *asynq.Task) error { return nil })); err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(live.Shutdown)
}

func (f *deadEarlyFleet) startDaemon() {
	f.t.Helper()
	f.daemon = fleettest.StartDaemon(f.t, fleettest.BuildJobreaper(f.t), fleettest.DaemonOptions{Name: "daemon",
		DatabaseURL: f.db.URL, RedisURL: f.redis.URL,
		Args: []string{"--schema", f.db.Schema, "--queues", f.q, "--interval", deadEarlyInterval.String(),
			"--heartbeat-interval", "1s", "--stall-timeout", deadEarlyStall.String()}})
}

// awaitDead waits until asynq holds id's task archived with its
// lease-expired error and no live server runs in the process of worker,
// and returns when it saw both.
func (f *deadEarlyFleet) awaitDead(id, worker string) time.Time {
	f.t.Helper()
	ctx := f.t.Context()
	deadline := time.Now().Add(asynqArchiveWithin)
	for {
		ends, err := f.state.TaskEnds(ctx, []asynqstate.TaskRef{{Queue: f.q, ID: id}})
		reg, regErr := f.state.LiveServers(ctx)
		if err == nil && regErr == nil && ends[0].Status == asynqstate.TaskArchived && ends[0].LastErr == asynqstate.ErrLeaseExpiredText &&
			!reg.Processes[worker] && reg.Queues[f.q] {
			return time.Now()
		}
		if time.Now().After(deadline) {
			f.t.Fatalf("asynq did not archive %s's task with its lease expired, its worker %s gone from the registry, within %s: %+v (%v), %+v (%v)",
				id, worker, asynqArchiveWithin, ends, err, reg, regErr)
		}
		time.Sleep(500 * time.Millisecond) // polling asynq's recoverer and heartbeats
	}
}

// claimedBy waits until id is PROCESSING and returns its worker.
func (f *deadEarlyFleet) claimedBy(id string) string {
	f.t.Helper()
	var worker string
	fleettest.WaitFor(f.t, id+" is claimed", func() bool {
		row := f.db.Read(f.t, id)
		worker = row.Worker
		return row.Status == jobs.StatusProcessing && worker != ""
	})
	return worker
}

// deadEarlyReaps counts id's reaped events of the dead-early rule.
func (f *deadEarlyFleet) deadEarlyReaps(id string) int64 {
	return f.db.Count(f.t, `SELECT count(*) FROM job_events WHERE job_id = $1 AND kind = 'reaped'
   AND detail->>'reason' = 'lost_task' AND (detail->>'dead_early')::boolean`, id)
}

// passes returns the daemon's count of clean passes.
func (f *deadEarlyFleet) passes() float64 {
	return f.daemon.Metric("jobreaper_passes_total", `outcome="ok"`)
}

// A worker process of a long type that opted into reap_dead_early is
// SIGKILLed on its job's last attempt: once asynq archived the task (its
// lease expired) and the worker left asynq's registry, the job is reaped
// as lost_task within stall timeout + two intervals, two hours before its
// max_runtime. The same death of a job of a type that did not opt in
// keeps the full rule: PROCESSING until max_runtime, then reaped.
func TestDeadEarly_KilledWorkerOfAnOptedInTypeIsReapedAtItsStallTimeout(t *testing.T) {
	t.Parallel()
	f := newDeadEarlyFleet(t)
	w := f.startWorker("w-killed", "--kind", "hang")
	dead, plain := "J-dead", "J-plain"
	f.enqueue(dead, "video.encode", "")
	f.enqueue(plain, "video.plain", "")
	worker := f.claimedBy(dead)
	if f.claimedBy(plain) != worker {
		t.Fatal("the two jobs were claimed by different workers")
	}
	if !defaultNameOf(worker) {
		t.Fatalf("worker name %q is not the guard's default host:pid", worker)
	}
	f.serveQueue()
	f.startDaemon()
	w.Signal(t, syscall.SIGKILL)
	w.Wait(t)

	gone := f.awaitDead(dead, worker)
	deadline := gone.Add(deadEarlyWithin)
	for f.db.Read(t, dead).Status == jobs.StatusProcessing {
		if time.Now().After(deadline) {
			t.Fatalf("%s not reaped within %s of asynq archiving its task and its worker leaving the registry", dead, deadEarlyWithin)
		}
		time.Sleep(200 * time.Millisecond) // polling the daemon's passes
	}
	row := f.db.Read(t, dead)
	if row.Status != jobs.StatusFailed || row.FailureReason != jobs.ReasonLostTask || f.deadEarlyReaps(dead) != 1 {
		t.Fatalf("%s = %+v with %d dead-early reaped events; want FAILED lost_task, once", dead, row, f.deadEarlyReaps(dead))
	}
	if n := f.db.Count(t, `SELECT count(*) FROM jobs WHERE id = $1 AND now() - started_at < interval '1 hour'`, dead); n != 1 {
		t.Fatal("the job was not reaped well before its max_runtime")
	}

	// The type without the opt-in: asynq says the same of its task, yet
	// passes well past its stall timeout leave it alone.
	f.awaitDead(plain, worker)
	from := f.passes()
	fleettest.WaitFor(t, "the daemon ran 2 x stall timeout of passes more", func() bool { return f.passes() >= from+2*deadEarlyStall.Seconds() })
	if row := f.db.Read(t, plain); row.Status != jobs.StatusProcessing {
		t.Fatalf("%s of a type without reap_dead_early = %+v before its max_runtime; want PROCESSING", plain, row)
	}
	// Its max_runtime passed: the full rule reaps it, not the early one.
	f.db.Exec(t, `UPDATE jobs SET started_at = now() - interval '2 hours 1 minute' WHERE id = $1`, plain)
	fleettest.WaitFor(t, plain+" reaped by the full rule", func() bool { return f.db.Read(t, plain).Status == jobs.StatusFailed })
	if row := f.db.Read(t, plain); row.FailureReason != jobs.ReasonLostTask || f.db.Events(t, plain, "reaped") != 1 || f.deadEarlyReaps(plain) != 0 {
		t.Fatalf("%s = %+v, %d dead-early reaps; want lost_task by the full rule", plain, row, f.deadEarlyReaps(plain))
	}
}

// A worker process cut off from Redis but not from PostgreSQL: asynq
// expires its task's lease and archives the task, and the worker leaves
// asynq's registry, just as if it had died; but its handler (one that
// ignores asynq's cancel) keeps heartbeating, so its job's idle time never
// reaches the stall timeout and the job is not reaped early. Once the
// handler stops heartbeating, the rule's last condition holds and the job
// is reaped early.
func TestDeadEarly_WorkerCutOffFromRedisButHeartbeatingIsNotReaped(t *testing.T) {
	t.Parallel()
	f := newDeadEarlyFleet(t)
	w := f.startWorker("w-cut", "--kind", "heartbeat", "--heartbeat-every", "200ms")
	id := "J-cut"
	f.enqueue(id, "video.encode", `{"ignore_cancel": true}`)
	worker := f.claimedBy(id)
	w.Await(t, "start "+id)
	f.serveQueue()
	f.startDaemon()
	w.Redis.Cut()

	f.awaitDead(id, worker)
	from := f.passes()
	fleettest.WaitFor(t, "the daemon ran 3 x stall timeout of passes more", func() bool { return f.passes() >= from+3*deadEarlyStall.Seconds() })
	if row := f.db.Read(t, id); row.Status != jobs.StatusProcessing || f.db.Events(t, id, "reaped") != 0 {
		t.Fatalf("%s of a live worker cut off from Redis = %+v; want PROCESSING, never reaped", id, row)
	}
	if n := f.db.Count(t, `SELECT count(*) FROM jobs WHERE id = $1 AND now() - updated_at < $2::interval`, id, deadEarlyStall.String()); n != 1 {
		t.Fatal("the worker's heartbeats did not keep the job's idle time under its stall timeout")
	}

	// It stops heartbeating: reaped early within the bound.
	w.Tell(t, "hang "+id)
	stopped := time.Now()
	for f.db.Read(t, id).Status == jobs.StatusProcessing {
		if time.Now().After(stopped.Add(deadEarlyWithin)) {
			t.Fatalf("%s not reaped within %s of its last heartbeat", id, deadEarlyWithin)
		}
		time.Sleep(200 * time.Millisecond) // polling the daemon's passes
	}
	if row := f.db.Read(t, id); row.FailureReason != jobs.ReasonLostTask || f.deadEarlyReaps(id) != 1 {
		t.Fatalf("%s = %+v; want reaped as lost_task by the dead-early rule", id, row)
	}
}

// defaultNameOf reports whether name looks like "<host>:<pid>".
func defaultNameOf(name string) bool {
	for i := len(name) - 1; i > 0; i-- {
		if name[i] == ':' {
			return i < len(name)-1
		}
		if name[i] < '0' || name[i] > '9' {
			return false
		}
	}
	return false
}
