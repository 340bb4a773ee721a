package main

// The blip fleet: the multi-process world of the safety-valve tests (cases
// B47, B48 and B49): daemons of the real binary and worker processes
// (internal/fleettest), each with PostgreSQL and Redis relays of its own
// that a test cuts and restores, on one schema and a redis-server of the
// test's own. The tests assert on the database the test reaches directly,
// never through a relay, and on the daemons' metrics.

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jackc/pgx/v5"

	"github.com/jobreaper/jobreaper/internal/fleettest"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
	"github.com/jobreaper/jobreaper/queue"
	"github.com/jobreaper/jobreaper/queue/redistest"
)

// The timings of the blip tests: the cases' 5 s stall timeout scaled up to
// 10 s, a heartbeat interval of 2 s (the daemon's --heartbeat-interval and
// every worker's Heartbeater) and a pass every second, so that the stall
// rule's smallest stall timeout is 2 x 2 s + 1 s = 5 s; live handlers call
// Heartbeat every 200 ms, so their progress lands every 2 to 2.2 s. Every
// job type's max_runtime is 1 s: each job is past it a second after its
// claim, and only the stall timeout stands between it and a reap.
const (
	blipStall     = 10 * time.Second
	blipHeartbeat = 2 * time.Second
	blipInterval  = time.Second
	blipTick      = 200 * time.Millisecond
	// blipOutage is B47's outage: the stall timeout plus one heartbeat
	// interval, so that every live job looks stalled when PostgreSQL
	// comes back.
	blipOutage = blipStall + blipHeartbeat
)

// Job types of the blip fleet.
const (
	blipLive = "blip.live" // max_runtime 1 s
	blipAuto = "blip.auto" // the same, auto_complete
)

// blipFleet is one blip test's world.
type blipFleet struct {
	t         *testing.T
	db        *jobstest.DB
	redis     *redistest.Server
	client    *asynq.Client
	bin       string // jobreaper, with the failpoints tag
	workerBin string
	workers   []*fleettest.Worker
}

// newBlipFleet builds the binaries, starts a redis-server of the test's
// own (redisArgs appended to its command line) and creates the job types
// on db (a jobstest schema, or one of the test's own cluster).
func newBlipFleet(t *testing.T, db *jobstest.DB, redisArgs ...string) *blipFleet {
	t.Helper()
	f := &blipFleet{t: t, db: db, redis: redistest.Start(t, redisArgs...), bin: fleettest.BuildJobreaper(t), workerBin: fleettest.BuildWorker(t)}
	f.client = asynq.NewClientFromRedisClient(f.redis.Client(t))
	t.Cleanup(func() { _ = f.client.Close() })
	db.JobType(t, blipLive, "1 second", "", "")
	db.JobType(t, blipAuto, "1 second", "", "")
	db.Exec(t, `UPDATE `+db.Table("job_types")+` SET auto_complete = true WHERE name = $1`, blipAuto)
	return f
}

// daemon starts `jobreaper run` over queues (comma-separated) with the
// blip timings, the outage grace on unless extra turns it off (the tests'
// environment turns it off), the storm limits at their defaults unless
// extra sets them, and relays of its own.
func (f *blipFleet) daemon(name, queues string, extra ...string) *fleettest.Daemon {
	f.t.Helper()
	return f.daemonWith("", name, queues, extra...)
}

// daemonWith is daemon with JOBREAPER_FAILPOINTS set to failpoints for
// this process only.
func (f *blipFleet) daemonWith(failpoints, name, queues string, extra ...string) *fleettest.Daemon {
	f.t.Helper()
	args := append([]string{"--schema", f.db.Schema, "--queues", queues, "--interval", blipInterval.String(),
		"--stall-timeout", blipStall.String(), "--heartbeat-interval", blipHeartbeat.String(), "--op-timeout", "2s",
		"--outage-grace=true", "--log-level", "info"}, extra...)
	return fleettest.StartDaemon(f.t, f.bin, fleettest.DaemonOptions{Name: name, DatabaseURL: f.db.URL, RedisURL: f.redis.URL,
		Args: args, LogTail: 256 << 10, Failpoints: failpoints})
}

// worker starts a worker process serving queues (comma-separated) with
// room for concurrency handlers, whose Heartbeater writes at most once per
// blipHeartbeat.
func (f *blipFleet) worker(name, queues string, concurrency int, extra ...string) *fleettest.Worker {
	f.t.Helper()
	w := fleettest.StartWorker(f.t, f.workerBin, fleettest.WorkerOptions{Name: name, DatabaseURL: f.db.URL, Schema: f.db.Schema,
		RedisURL: f.redis.URL, Queue: queues,
		Args: append([]string{"--heartbeat-interval", blipHeartbeat.String(), "--concurrency", fmt.Sprint(concurrency),
			"--heartbeat-every", blipTick.String()}, extra...)})
	f.workers = append(f.workers, w)
	return w
}

// blipJob is a worker program payload (its doc comment says what each
// field does).
type blipJob struct {
	Kind      string `json:"kind,omitempty"`
	HangAfter string `json:"hang_after,omitempty"`
	RunFor    string `json:"run_for,omitempty"`
	Code      string `json:"code,omitempty"`
	Wait      bool   `json:"wait,omitempty"`
	RetryKind string `json:"retry_kind,omitempty"`
}

// jobIDs returns n job IDs prefix-0000, prefix-0001, ...
func jobIDs(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s-%04d", prefix, i)
	}
	return out
}

// enqueue inserts a QUEUED row of typ in q for each of ids and enqueues
// its task with the enqueue helper, payload p, and opts.
func (f *blipFleet) enqueue(q, typ string, ids []string, p blipJob, opts ...asynq.Option) {
	f.t.Helper()
	raw, err := json.Marshal(p)
	if err != nil {
		f.t.Fatal(err)
	}
	f.db.Exec(f.t, `INSERT INTO `+f.db.Table("jobs")+` (id, type, status, queue) SELECT id, $2, 'QUEUED', $3 FROM unnest($1::text[]) AS id`,
		ids, typ, q)
	store := f.db.Store()
	for _, id := range ids {
		if _, err := queue.Enqueue(f.t.Context(), f.client, store, asynq.NewTask(typ, raw), id, opts...); err != nil {
			f.t.Fatalf("enqueueing %s: %v", id, err)
		}
	}
}

// count counts the jobs among ids whose row matches where (SQL over the
// jobs table; args from $2).
func (f *blipFleet) count(ids []string, where string, args ...any) int {
	f.t.Helper()
	return int(f.db.Count(f.t, `SELECT count(*) FROM `+f.db.Table("jobs")+` WHERE id = ANY($1) AND `+where, append([]any{ids}, args...)...))
}

// waitLive waits until every job of ids is claimed, has heartbeated and is
// past its max_runtime.
func (f *blipFleet) waitLive(ids []string) {
	f.t.Helper()
	fleettest.WaitFor(f.t, fmt.Sprintf("the %d jobs are claimed, heartbeating and past max_runtime", len(ids)), func() bool {
		return f.count(ids, `status = 'PROCESSING' AND progress_mark > 0 AND now() - started_at > interval '1.5 seconds'`) == len(ids)
	})
}

// now reads the database clock.
func (f *blipFleet) now() time.Time {
	f.t.Helper()
	var now time.Time
	if err := f.db.Pool.QueryRow(f.t.Context(), `SELECT now()`).Scan(&now); err != nil {
		f.t.Fatal(err)
	}
	return now
}

// changed lists the jobs of ids that are no longer PROCESSING, as
// "id status reason".
func (f *blipFleet) changed(ids []string) []string {
	f.t.Helper()
	rows, err := f.db.Pool.Query(f.t.Context(), `SELECT id || ' ' || status || ' ' || coalesce(failure_reason, '') FROM `+
		f.db.Table("jobs")+` WHERE id = ANY($1) AND status <> 'PROCESSING' ORDER BY id`, ids)
	if err != nil {
		f.t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		f.t.Fatal(err)
	}
	return out
}

// requireNoneReaped fails the test when a job of ids was reaped (or left
// PROCESSING any other way).
func (f *blipFleet) requireNoneReaped(what string, ids []string) {
	f.t.Helper()
	if changed := f.changed(ids); len(changed) > 0 {
		f.t.Fatalf("%s: %d of %d live jobs were reaped or changed: %v", what, len(changed), len(ids), changed)
	}
	if n := f.db.Count(f.t, `SELECT count(*) FROM `+f.db.Table("job_events")+` WHERE job_id = ANY($1) AND kind = 'reaped'`, ids); n != 0 {
		f.t.Fatalf("%s: %d reaped events among %d live jobs", what, n, len(ids))
	}
}

// reapedStalled counts the jobs of ids FAILED as stalled.
func (f *blipFleet) reapedStalled(ids []string) int {
	return f.count(ids, `status = 'FAILED' AND failure_reason = 'stalled'`)
}

// tell sends command to every worker and returns to how many handlers in
// all it applied.
func (f *blipFleet) tell(command string) int {
	f.t.Helper()
	n := 0
	for _, w := range f.workers {
		n += w.Tell(f.t, command)
	}
	return n
}

// cut cuts the PostgreSQL relays of the workers and daemons given;
// restore restores them.
func cut(relays ...*fleettest.Relay) {
	for _, r := range relays {
		r.Cut()
	}
}

func restore(relays ...*fleettest.Relay) {
	for _, r := range relays {
		r.Restore()
	}
}

// pgRelays returns the workers' PostgreSQL relays.
func pgRelays(ws ...*fleettest.Worker) []*fleettest.Relay {
	var out []*fleettest.Relay
	for _, w := range ws {
		out = append(out, w.PG)
	}
	return out
}

// okPasses is a daemon's count of clean passes (-1 when it does not
// answer).
func okPasses(d *fleettest.Daemon) float64 { return d.Metric("jobreaper_passes_total", `outcome="ok"`) }

// waitPasses waits until d ran n more clean passes than from.
func waitPasses(t *testing.T, d *fleettest.Daemon, from float64, n int) {
	t.Helper()
	fleettest.WaitFor(t, fmt.Sprintf("%s runs %d more clean passes", d.Name, n), func() bool { return okPasses(d) >= from+float64(n) })
}

// waitMetric waits until d exports want as name (the sum of its series
// holding every fragment). A pass counts all its metrics at its end, so a
// test that saw a pass's effect in the database reads them this way.
func waitMetric(t *testing.T, d *fleettest.Daemon, want float64, name string, fragments ...string) {
	t.Helper()
	fleettest.WaitFor(t, fmt.Sprintf("%s exports %s %s = %v (now %v)", d.Name, name, strings.Join(fragments, ","), want,
		d.Metric(name, fragments...)), func() bool { return d.Metric(name, fragments...) == want })
}

// reapPasses groups the reaped events of ids by the clock reading of the
// pass that reaped them (their evidence's db_now) and returns each pass's
// count, in order.
func (f *blipFleet) reapPasses(ids []string) []int {
	f.t.Helper()
	rows, err := f.db.Pool.Query(f.t.Context(), `SELECT count(*) FROM `+f.db.Table("job_events")+`
 WHERE job_id = ANY($1) AND kind = 'reaped' GROUP BY detail->>'db_now' ORDER BY min(detail->>'db_now')`, ids)
	if err != nil {
		f.t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[int])
	if err != nil {
		f.t.Fatal(err)
	}
	return out
}

// requireLogged fails unless d's log holds a line with every fragment.
func requireLogged(t *testing.T, d *fleettest.Daemon, fragments ...string) {
	t.Helper()
	if d.Log.Count(fragments...) == 0 {
		t.Fatalf("%s logged no line with %s", d.Name, strings.Join(fragments, ", "))
	}
}

// sleepFor lets a fault last (an outage, a cut): never a wait for an
// effect, which polls.
func sleepFor(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}
