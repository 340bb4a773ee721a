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

// deadEarlyFleet is the test's schema, its own Redis, an asynq server of
// the test's own that serves the queues (its recoverer archives the tasks
// of a dead worker), and a daemon.
type deadEarlyFleet struct {
	t      *testing.T
	db     *jobstest.DB
	redis  *redistest.Server
	rdb    *redis.Client
	daemon *fleettest.Daemon
	state  *asynqstate.StatusReader
}

func newDeadEarlyFleet(t *testing.T) *deadEarlyFleet {
	t.Helper()
	db := jobstest.New(t)
	srv := redistest.Start(t)
	f := &deadEarlyFleet{t: t, db: db, redis: srv, rdb: srv.Client(t)}
	f.state = asynqstate.NewStatusReader(f.rdb, 0)
	// Long types: max_runtime 2 h, a short stall timeout; one opted in.
	db.JobType(t, "video.encode", "2 hours", "8 seconds", "4 hours")
	db.Exec(t, `UPDATE job_types SET reap_dead_early = true WHERE name = 'video.encode'`)
	db.JobType(t, "video.plain", "2 hours", "8 seconds", "4 hours")
	return f
}

// startWorker starts a worker process of queue q whose guard names itself
// "<host>:<pid>", the default.
func (f *deadEarlyFleet) startWorker(name, q string, args ...string) *fleettest.Worker {
	f.t.Helper()
	return fleettest.StartWorker(f.t, fleettest.BuildWorker(f.t), fleettest.WorkerOptions{Name: name, DefaultName: true,
		DatabaseURL: f.db.URL, Schema: f.db.Schema, RedisURL: f.redis.URL, Queue: q, Args: args})
}

// enqueue inserts id QUEUED in q and enqueues its last (only) attempt.
func (f *deadEarlyFleet) enqueue(id, typ, q, payload string) {
	f.t.Helper()
	f.db.Insert(f.t, jobstest.Job{ID: id, Type: typ, Status: jobs.StatusQueued, Queue: q})
	if _, err := queue.Enqueue(f.t.Context(), asynq.NewClientFromRedisClient(f.rdb), f.db.Store(), asynq.NewTask(typ, []byte(payload)), id,
		asynq.MaxRetry(0)); err != nil {
		f.t.Fatal(err)
	}
}

// serveQueues starts the test's own asynq server of queues; it takes no
// task while the workers hold theirs, and its recoverer archives the
// tasks whose lease expired.
func (f *deadEarlyFleet) serveQueues(queues ...string) {
	f.t.Helper()
	weights := map[string]int{}
	for _, q := range queues {
		weights[q] = 1
	}
	live := asynq.NewServerFromRedisClient(f.rdb, asynq.Config{Queues: weights, LogLevel: asynq.FatalLevel})
	if err := live.Start(asynq.HandlerFunc(func(context.Context, *asynq.Task) error { return nil })); err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(live.Shutdown)
}

func (f *deadEarlyFleet) startDaemon(queues string) {
	f.t.Helper()
	f.daemon = fleettest.StartDaemon(f.t, fleettest.BuildJobreaper(f.t), fleettest.DaemonOptions{Name: "daemon",
		DatabaseURL: f.db.URL, RedisURL: f.redis.URL,
		Args: []string{"--schema", f.db.Schema, "--queues", queues, "--interval", deadEarlyInterval.String(),
			"--heartbeat-interval", "1s", "--stall-timeout", deadEarlyStall.String()}})
}

// awaitDead waits until asynq holds the task of id (in q) archived with its
// lease-expired error, no live server runs in the process of worker, and
// a live server serves q, and returns when it saw all three.
func (f *deadEarlyFleet) awaitDead(id, q, worker string) time.Time {
	f.t.Helper()
	ctx := f.t.Context()
	deadline := time.Now().Add(asynqArchiveWithin)
	for {
		ends, err := f.state.TaskEnds(ctx, []asynqstate.TaskRef{{Queue: q, ID: id}})
		reg, regErr := f.state.LiveServers(ctx)
		if err == nil && regErr == nil && ends[0].Status == asynqstate.TaskArchived && ends[0].LastErr == asynqstate.ErrLeaseExpiredText &&
			!reg.Processes[worker] && reg.Queues[q] {
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
	if !defaultNameOf(worker) {
		f.t.Fatalf("worker name %q is not the guard's default host:pid", worker)
	}
	return worker
}

// awaitReaped waits until id is no longer PROCESSING, failing the test
// when that takes longer than within from since.
func (f *deadEarlyFleet) awaitReaped(id string, since time.Time, within time.Duration, what string) {
	f.t.Helper()
	for f.db.Read(f.t, id).Status == jobs.StatusProcessing {
		if time.Now().After(since.Add(within)) {
			f.t.Fatalf("%s not reaped within %s of %s", id, within, what)
		}
		time.Sleep(200 * time.Millisecond) // polling the daemon's passes
	}
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

// Three jobs of long types (max_runtime 2 h, stall timeout 8 s) on their
// last attempt, side by side so that one asynq recoverer tick serves all:
//
//   - J-dead, of a type that opted into reap_dead_early, whose worker
//     process is SIGKILLed: once asynq archived its task (lease expired)
//     and the worker left asynq's registry, it is reaped as lost_task
//     within stall timeout + two intervals, two hours before max_runtime;
//   - J-plain, of a type that did not opt in, on the same killed worker:
//     asynq says the same of it, yet it stays PROCESSING until its
//     max_runtime passes, and then the full rule reaps it;
//   - J-cut, of the opted-in type, whose worker process is cut off from
//     Redis but not from PostgreSQL: asynq expires its lease and archives
//     its task, and the worker leaves the registry, as if dead; but its
//     handler (one that ignores asynq's cancel) keeps heartbeating, so it
//     is not reaped. Once it stops heartbeating, the rule's last condition
//     holds and it is reaped early too.
func TestDeadEarly_OnlyADeadAttemptOfAnOptedInTypeIsReapedBeforeMaxRuntime(t *testing.T) {
	t.Parallel()
	f := newDeadEarlyFleet(t)
	qKilled, qCut := "long-killed", "long-cut"
	killed := f.startWorker("w-killed", qKilled, "--kind", "hang")
	cut := f.startWorker("w-cut", qCut, "--kind", "heartbeat", "--heartbeat-every", "200ms")
	dead, plain, alive := "J-dead", "J-plain", "J-cut"
	f.enqueue(dead, "video.encode", qKilled, "")
	f.enqueue(plain, "video.plain", qKilled, "")
	f.enqueue(alive, "video.encode", qCut, `{"ignore_cancel": true}`)
	killedName := f.claimedBy(dead)
	if f.claimedBy(plain) != killedName {
		t.Fatal("J-dead and J-plain were claimed by different workers")
	}
	cutName := f.claimedBy(alive)
	cut.Await(t, "start "+alive)
	f.serveQueues(qKilled, qCut)
	f.startDaemon(qKilled + "," + qCut)
	killed.Signal(t, syscall.SIGKILL)
	killed.Wait(t)
	cut.Redis.Cut()

	gone := f.awaitDead(dead, qKilled, killedName)
	f.awaitReaped(dead, gone, deadEarlyWithin, "asynq archiving its task and its worker leaving the registry")
	row := f.db.Read(t, dead)
	if row.Status != jobs.StatusFailed || row.FailureReason != jobs.ReasonLostTask || f.deadEarlyReaps(dead) != 1 {
		t.Fatalf("%s = %+v with %d dead-early reaped events; want FAILED lost_task, once", dead, row, f.deadEarlyReaps(dead))
	}
	if n := f.db.Count(t, `SELECT count(*) FROM jobs WHERE id = $1 AND now() - started_at < interval '1 hour'`, dead); n != 1 {
		t.Fatal("the job was not reaped well before its max_runtime")
	}

	// asynq says the same of J-plain and J-cut, yet passes for three stall
	// timeouts leave both alone.
	f.awaitDead(plain, qKilled, killedName)
	f.awaitDead(alive, qCut, cutName)
	from := f.passes()
	fleettest.WaitFor(t, "the daemon ran 3 x stall timeout of passes more", func() bool { return f.passes() >= from+3*deadEarlyStall.Seconds() })
	if row := f.db.Read(t, plain); row.Status != jobs.StatusProcessing {
		t.Fatalf("%s of a type without reap_dead_early = %+v before its max_runtime; want PROCESSING", plain, row)
	}
	if row := f.db.Read(t, alive); row.Status != jobs.StatusProcessing || f.db.Events(t, alive, "reaped") != 0 {
		t.Fatalf("%s of a live worker cut off from Redis = %+v; want PROCESSING, never reaped", alive, row)
	}
	if n := f.db.Count(t, `SELECT count(*) FROM jobs WHERE id = $1 AND now() - updated_at < $2::interval`, alive, deadEarlyStall.String()); n != 1 {
		t.Fatal("the cut worker's heartbeats did not keep its job's idle time under the stall timeout")
	}

	// J-plain's max_runtime passed: the full rule reaps it, not the early one.
	f.db.Exec(t, `UPDATE jobs SET started_at = now() - interval '2 hours 1 minute' WHERE id = $1`, plain)
	f.awaitReaped(plain, time.Now(), deadEarlyWithin, "its max_runtime passing")
	if row := f.db.Read(t, plain); row.FailureReason != jobs.ReasonLostTask || f.db.Events(t, plain, "reaped") != 1 || f.deadEarlyReaps(plain) != 0 {
		t.Fatalf("%s = %+v, %d dead-early reaps; want lost_task by the full rule", plain, row, f.deadEarlyReaps(plain))
	}

	// J-cut's handler stops heartbeating: reaped early within the bound.
	cut.Tell(t, "hang "+alive)
	f.awaitReaped(alive, time.Now(), deadEarlyWithin, "its last heartbeat")
	if row := f.db.Read(t, alive); row.FailureReason != jobs.ReasonLostTask || f.deadEarlyReaps(alive) != 1 {
		t.Fatalf("%s = %+v; want reaped as lost_task by the dead-early rule", alive, row)
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
