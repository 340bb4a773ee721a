package main

// The fault suite: PostgreSQL connections cut and Redis stopped under a
// running daemon, the reaper binary and a worker process killed with
// SIGKILL, each at random points of a pass or a batch, against the real
// product (set-based reaps, real PostgreSQL, a redis-server of the test's
// own). After each fault the tests check what a fault must never leave
// behind: a half-written reap, a reaped job without its marker once a good
// pass has run, a daemon that does not come back by itself, a worker's job
// that lost or repeated a batch. Each records its figures under the suite
// "faults" (jobstest.Figure).

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/jobreaper/jobreaper/internal/asynqstate"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
	"github.com/jobreaper/jobreaper/queue"
	"github.com/jobreaper/jobreaper/queue/queuetest"
)

// Environment of the fault suite.
const (
	// envFaultKills sets how many times the reaper binary is killed with
	// SIGKILL (default faultKillsDefault); the PostgreSQL cuts and Redis
	// stops are a quarter of it (at least faultServiceMin).
	envFaultKills = "JOBREAPER_FAULT_KILLS"
	// envFaultSeed replays a run: the seed of every random point, as the
	// test logged it.
	envFaultSeed = "JOBREAPER_FAULT_SEED"
)

const (
	// faultKillsDefault is the CI-sized number of reaper kills.
	faultKillsDefault = 20
	// faultServiceMin is the least number of PostgreSQL cuts and of Redis
	// stops per run.
	faultServiceMin = 4
	// faultJobsPerRound stalled jobs are added before each fault: two reap
	// batches (pgstore.ReapBatchSize is 1,000), so that a fault can fall
	// between two committed batches, between a commit and its markers, or
	// inside a transaction.
	faultJobsPerRound = 1500
	// faultWait bounds every wait for an effect of the daemon or of asynq.
	// It is generous on purpose: the suite asserts outcomes, never
	// durations, and runs on a shared 2-core machine under -race.
	faultWait = 2 * time.Minute
	// faultSuite names the figures' suite.
	faultSuite = "faults"
)

// faultKills returns how many reaper kills to inject: JOBREAPER_FAULT_KILLS
// or faultKillsDefault.
func faultKills(t *testing.T) int {
	t.Helper()
	s := os.Getenv(envFaultKills)
	if s == "" {
		return faultKillsDefault
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 {
		t.Fatalf("%s=%q: want a whole number of kills, at least 1", envFaultKills, s)
	}
	return n
}

// faultServiceRounds returns how many PostgreSQL cuts, and how many Redis
// stops, to inject: a quarter of the reaper kills, at least
// faultServiceMin.
func faultServiceRounds(t *testing.T) int {
	return max(faultServiceMin, faultKills(t)/4)
}

// faultRand returns the random source of a test's fault points, seeded
// from JOBREAPER_FAULT_SEED when set (a replay) and from the clock
// otherwise. The seed is logged and recorded as the figure faults/seed, so
// that any run can be replayed with -run <test> and the variable set.
func faultRand(t *testing.T) *rand.Rand {
	t.Helper()
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv(envFaultSeed); s != "" {
		var err error
		if seed, err = strconv.ParseUint(s, 10, 64); err != nil {
			t.Fatalf("%s=%q: want an unsigned decimal seed", envFaultSeed, s)
		}
	}
	t.Logf("fault seed %d: replay with %s=%d go test -race -run '^%s$' ./cmd/jobreaper/", seed, envFaultSeed, seed, t.Name())
	jobstest.Figure(t, faultSuite, "seed", fmt.Sprintf("%s=%d", t.Name(), seed))
	return rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
}

// faultLiveQueue is a queue a live asynq server serves in the Redis of a
// fault test whose passes repair or re-assert markers: marker writes are
// held while no live server serves a queue of the pass (a wrong Redis
// looks the same). The stalled jobs' own queue cannot be the served one:
// a server would take the tasks queuetest.MakeActive moves.
const faultLiveQueue = "faults-live"

// faultQueues is the daemon's --queues of such a test.
const faultQueues = faultQueue + "," + faultLiveQueue

// serveLiveQueue runs an asynq server serving faultLiveQueue on rdb,
// stopped at cleanup, enqueues one task there (asynq knows a queue from its
// first enqueue), and waits until the server is live.
func serveLiveQueue(t *testing.T, rdb redis.UniversalClient) {
	t.Helper()
	srv := asynq.NewServerFromRedisClient(rdb, asynq.Config{Queues: map[string]int{faultLiveQueue: 1},
		LogLevel: asynq.FatalLevel, ShutdownTimeout: time.Second})
	if err := srv.Start(asynq.HandlerFunc(func(context.Context, *asynq.Task) error { return nil })); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	if _, err := asynq.NewClientFromRedisClient(rdb).EnqueueContext(t.Context(), asynq.NewTask("noop", nil),
		asynq.Queue(faultLiveQueue)); err != nil {
		t.Fatal(err)
	}
	reader := asynqstate.NewStatusReader(rdb, 0)
	waitUntil(t, faultWait, "a live asynq server serves "+faultLiveQueue, func() bool {
		live, err := reader.LiveQueues(t.Context())
		return err == nil && live[faultLiveQueue]
	})
}

// between returns a duration drawn uniformly from [lo, hi).
func between(rng *rand.Rand, lo, hi time.Duration) time.Duration {
	if hi <= lo {
		return lo
	}
	return lo + time.Duration(rng.Int64N(int64(hi-lo)))
}

// faultFixture is one fault test's schema: the job type, an on_failed
// cascade that counts its runs per job, and the config file naming it.
type faultFixture struct {
	db *jobstest.DB
	// config is the path of a config file with the cascade.
	config string
	// runs is the cascade's table, qualified with the schema.
	runs string
}

// newFaultFixture migrates a schema with job type report.export (30 min)
// and a cascade_runs table that the type's on_failed cascade increments
// once per run for the failed job.
func newFaultFixture(t *testing.T) *faultFixture {
	t.Helper()
	db := jobstest.New(t)
	db.JobType(t, "report.export", "30 minutes", "", "")
	f := &faultFixture{db: db, runs: db.Table("cascade_runs")}
	db.Exec(t, `CREATE TABLE `+f.runs+` (job_id text PRIMARY KEY, runs int NOT NULL)`)
	f.config = filepath.Join(t.TempDir(), "jobreaper.yaml")
	// Each round adds its stalled jobs at once, which is not a storm
	// here: the stall-storm limits are off.
	yaml := fmt.Sprintf("max_stalled_per_pass: 0\nmax_stalled_fraction: 0\ncascades:\n  report.export:\n    on_failed:\n      - 'INSERT INTO %s AS c (job_id, runs) VALUES (@job_id, 1) ON CONFLICT (job_id) DO UPDATE SET runs = c.runs + 1'\n", f.runs)
	if err := os.WriteFile(f.config, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	return f
}

// addStalled inserts n PROCESSING jobs of queue q, started 31 min ago and
// idle for 21 (stalled under a 30 min limit and a stall timeout up to 21
// min), with IDs prefix-00001 and up, and makes their tasks active in rdb
// as asynq's dequeue does. It returns the IDs' common prefix for LIKE.
func (f *faultFixture) addStalled(t *testing.T, rdb redis.UniversalClient, q, prefix string, n int) string {
	t.Helper()
	f.db.Exec(t, `INSERT INTO `+f.db.Table("jobs")+` (id, type, status, generation, worker, queue, started_at, updated_at)
SELECT $1 || '-' || lpad(i::text, 5, '0'), 'report.export', 'PROCESSING', 1, 'w-gone', $2,
       now() - interval '31 minutes', now() - interval '21 minutes'
  FROM generate_series(1, $3) AS i`, prefix, q, n)
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("%s-%05d", prefix, i+1)
	}
	if err := queuetest.MakeActive(t.Context(), rdb, q, "report.export", ids); err != nil {
		t.Fatal(err)
	}
	return prefix + "-%"
}

// count returns how many jobs whose ID is LIKE like have status.
func (f *faultFixture) count(t *testing.T, like, status string) int {
	t.Helper()
	return int(f.db.Count(t, `SELECT count(*) FROM `+f.db.Table("jobs")+` WHERE id LIKE $1 AND status = $2`, like, status))
}

// lost returns how many of the want jobs whose ID is LIKE like are gone
// from the table.
func (f *faultFixture) lost(t *testing.T, like string, want int) int {
	t.Helper()
	return want - int(f.db.Count(t, `SELECT count(*) FROM `+f.db.Table("jobs")+` WHERE id LIKE $1`, like))
}

// halfWrittenSQL finds, over the whole schema, every trace of a reap that
// was not written whole: the FAILED row, its one reaped event of the same
// generation and reason, and its one on_failed cascade run commit together
// or not at all.
const halfWrittenSQL = `
SELECT 'FAILED ' || j.failure_reason || ' without its reaped event: ' || j.id
  FROM {jobs} j
 WHERE j.status = 'FAILED' AND j.failure_reason IN ('stalled', 'lost_task')
   AND NOT EXISTS (SELECT 1 FROM {events} e WHERE e.job_id = j.id AND e.kind = 'reaped' AND e.generation = j.generation)
UNION ALL
SELECT 'reaped event without its FAILED row: ' || e.job_id || ' generation ' || e.generation
  FROM {events} e
 WHERE e.kind = 'reaped'
   AND NOT EXISTS (SELECT 1 FROM {jobs} j WHERE j.id = e.job_id AND j.status = 'FAILED'
                      AND j.failure_reason = e.detail->>'reason' AND j.generation = e.generation)
UNION ALL
SELECT count(*) || ' reaped events of one generation: ' || job_id || ' generation ' || generation
  FROM {events} WHERE kind = 'reaped' GROUP BY job_id, generation HAVING count(*) > 1
UNION ALL
SELECT 'on_failed cascade ran ' || c.runs || ' times: ' || c.job_id
  FROM {runs} c WHERE c.runs <> 1
UNION ALL
SELECT 'on_failed cascade ran for a job that is not FAILED: ' || c.job_id
  FROM {runs} c WHERE NOT EXISTS (SELECT 1 FROM {jobs} j WHERE j.id = c.job_id AND j.status = 'FAILED')
UNION ALL
SELECT 'FAILED ' || j.failure_reason || ' without its on_failed cascade: ' || j.id
  FROM {jobs} j
 WHERE j.status = 'FAILED' AND j.failure_reason IN ('stalled', 'lost_task')
   AND NOT EXISTS (SELECT 1 FROM {runs} c WHERE c.job_id = j.id)`

// checkReaps reports every half-written reap of the schema (halfWrittenSQL)
// as a test error and returns how many it found.
func (f *faultFixture) checkReaps(t *testing.T, after string) int {
	t.Helper()
	// Statistics first: on a busy server autovacuum may not have analyzed
	// the tables since they were empty, and the anti-joins then run as
	// nested loops over the whole tables (minutes at 100,000 rows).
	f.db.Exec(t, `ANALYZE `+f.db.Table("jobs")+`, `+f.db.Table("job_events")+`, `+f.runs)
	sql := strings.NewReplacer("{jobs}", f.db.Table("jobs"), "{events}", f.db.Table("job_events"), "{runs}", f.runs).Replace(halfWrittenSQL)
	rows, err := f.db.Pool.Query(t.Context(), sql)
	if err != nil {
		t.Fatalf("checking reaps: %v", err)
	}
	defer rows.Close()
	n := 0
	for rows.Next() {
		var what string
		if err := rows.Scan(&what); err != nil {
			t.Fatal(err)
		}
		if n++; n <= 20 {
			t.Errorf("after %s: half-written reap: %s", after, what)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatalf("checking reaps: %v", err)
	}
	if n > 20 {
		t.Errorf("after %s: %d half-written reaps in all", after, n)
	}
	return n
}

// markerSlack is how far a marker's TTL may be from 7 days after its reap
// (as in case B21): the marker is written just after the commit, or
// restored later with what is left of the 7 days.
const markerSlack = 60 * time.Second

// checkMarkers checks the marker of every job reaped with an ID LIKE like:
// it holds the reaped generation and expires 7 days after the reap (within
// markerSlack). It reports each violation as a test error and returns how
// many it found.
func (f *faultFixture) checkMarkers(t *testing.T, rdb redis.UniversalClient, like, after string) int {
	t.Helper()
	type reaped struct {
		id         string
		generation int64
		left       time.Duration // of the 7 days, on the database clock
	}
	rows, err := f.db.Pool.Query(t.Context(), `SELECT id, generation, extract(epoch FROM now() - finished_at)::float8
  FROM `+f.db.Table("jobs")+` WHERE status = 'FAILED' AND failure_reason IN ('stalled', 'lost_task') AND id LIKE $1 ORDER BY id`, like)
	if err != nil {
		t.Fatalf("reading reaped jobs: %v", err)
	}
	var all []reaped
	for rows.Next() {
		var r reaped
		var age float64
		if err := rows.Scan(&r.id, &r.generation, &age); err != nil {
			t.Fatal(err)
		}
		r.left = queue.MarkerTTL - time.Duration(age*float64(time.Second))
		all = append(all, r)
	}
	if err := rows.Err(); err != nil {
		t.Fatalf("reading reaped jobs: %v", err)
	}
	bad := 0
	report := func(format string, args ...any) {
		if bad++; bad <= 20 {
			t.Errorf("after %s: "+format, append([]any{after}, args...)...)
		}
	}
	for start := 0; start < len(all); start += 1000 {
		chunk := all[start:min(start+1000, len(all))]
		gets := make([]*redis.StringCmd, len(chunk))
		ttls := make([]*redis.DurationCmd, len(chunk))
		_, err := rdb.Pipelined(t.Context(), func(p redis.Pipeliner) error {
			for i, r := range chunk {
				gets[i] = p.Get(t.Context(), queue.MarkerKey(r.id))
				ttls[i] = p.PTTL(t.Context(), queue.MarkerKey(r.id))
			}
			return nil
		})
		if err != nil && err != redis.Nil {
			t.Fatalf("reading markers: %v", err)
		}
		for i, r := range chunk {
			val, err := gets[i].Result()
			if err == redis.Nil {
				report("job %s reaped at generation %d has no marker", r.id, r.generation)
				continue
			}
			if err != nil {
				t.Fatalf("reading the marker of %s: %v", r.id, err)
			}
			if val != strconv.FormatInt(r.generation, 10) {
				report("job %s reaped at generation %d has a marker holding %q", r.id, r.generation, val)
			}
			ttl := ttls[i].Val()
			if ttl > queue.MarkerTTL || ttl < r.left-markerSlack || ttl > r.left+markerSlack {
				report("job %s: marker TTL %s, want %s (7 days from its reap) within %s", r.id, ttl, r.left.Round(time.Second), markerSlack)
			}
		}
	}
	if bad > 20 {
		t.Errorf("after %s: %d marker violations in all", after, bad)
	}
	return bad
}

// missingMarkers returns how many of the jobs reaped with an ID LIKE like
// have no marker (yet).
func (f *faultFixture) missingMarkers(t *testing.T, rdb redis.UniversalClient, like string) int {
	t.Helper()
	rows, err := f.db.Pool.Query(t.Context(), `SELECT id FROM `+f.db.Table("jobs")+`
 WHERE status = 'FAILED' AND failure_reason IN ('stalled', 'lost_task') AND id LIKE $1`, like)
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		keys = append(keys, queue.MarkerKey(id))
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	missing := 0
	for start := 0; start < len(keys); start += 1000 {
		chunk := keys[start:min(start+1000, len(keys))]
		n, err := rdb.Exists(t.Context(), chunk...).Result()
		if err != nil {
			t.Fatal(err)
		}
		missing += len(chunk) - int(n)
	}
	return missing
}

// waitUntil polls cond every 20 ms until it holds, failing the test after
// timeout with what it waited for.
func waitUntil(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting until %s", timeout, what)
		}
		time.Sleep(20 * time.Millisecond) // polling
	}
}

// passesRE reads one outcome's count of jobreaper_passes_total.
var passesRE = regexp.MustCompile(`(?m)^jobreaper_passes_total\{outcome="(\w+)"\} (\S+)$`)

// passes returns the daemon's jobreaper_passes_total by outcome.
func (d *daemon) passes(t *testing.T) map[string]int {
	t.Helper()
	code, body := d.probe(t, "/metrics")
	if code != 200 {
		t.Fatalf("GET /metrics = %d", code)
	}
	out := map[string]int{}
	for _, m := range passesRE.FindAllStringSubmatch(body, -1) {
		v, err := strconv.ParseFloat(m[2], 64)
		if err != nil {
			t.Fatalf("jobreaper_passes_total{outcome=%q} = %q", m[1], m[2])
		}
		out[m[1]] = int(v)
	}
	return out
}

// logTailOnFailure logs the last lines of a daemon's log when the test
// fails.
func logTailOnFailure(t *testing.T, log *jobstest.SyncBuffer) {
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		s := log.String()
		if len(s) > 20000 {
			s = "...\n" + s[len(s)-20000:]
		}
		t.Logf("daemon log (tail):\n%s", s)
	})
}
