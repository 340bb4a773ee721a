package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
	"github.com/jobreaper/jobreaper/queue"
	"github.com/jobreaper/jobreaper/queue/redistest"
)

const (
	// envFaultWorkerKillAt tells TestFaultWorkerProcess where to stop
	// each job's attempt and wait for its SIGKILL:
	// "<job id>=<batch>:<phase>,..." (phase written: the batch's rows
	// are written and its transaction is open; committed: just after its
	// COMMIT).
	envFaultWorkerKillAt = "JOBREAPER_TEST_FAULT_KILL_AT"
	// envFaultWorkerName is the worker name the process claims with.
	envFaultWorkerName = "JOBREAPER_TEST_FAULT_WORKER"

	// faultItems is the total of each resumable job, in batches of
	// faultBatch items.
	faultItems = 40
	faultBatch = 5
)

// TestFaultWorkerProcess is not a test: run as a child process of
// TestReliabilityFaults_WorkerSIGKILLMidBatch with the variables above and
// those of TestWorkerProcess set, it is a worker process (an asynq server
// with the start guard) whose handler works through a job's items with
// resumable progress: one transaction per batch of faultBatch items,
// Advance with the batch's token first, then the batch's rows in the
// items table. At the point the parent named it says "reached" on stdout
// and waits for its SIGKILL. It says "violation ..." when a batch before
// the lease's cursor was applied again, or a token was not replayed.
// Without the variables it returns at once.
func TestFaultWorkerProcess(t *testing.T) {
	url, name := os.Getenv(envWorkerDB), os.Getenv(envFaultWorkerName)
	if url == "" || name == "" {
		return
	}
	// The parent holds our stdin: when it goes away, so do we.
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		os.Exit(0)
	}()
	say := func(format string, args ...any) { fmt.Printf(format+"\n", args...) }
	killAt := map[string]string{}
	for _, p := range strings.Split(os.Getenv(envFaultWorkerKillAt), ",") {
		if id, at, ok := strings.Cut(p, "="); ok {
			killAt[id] = at
		}
	}
	ctx := context.Background()
	schema := os.Getenv(envWorkerSchema)
	pool, err := jobs.Connect(ctx, url, schema)
	if err != nil {
		t.Fatal(err)
	}
	store := jobs.NewStore(pool, jobs.WithSchema(schema))
	rdb := redis.NewClient(&redis.Options{Addr: os.Getenv(envWorkerRedis), ContextTimeoutEnabled: true})
	markers, err := queue.NewMarkerStore(rdb)
	if err != nil {
		t.Fatal(err)
	}
	stopAt := func(id string, batch int64, phase string) {
		if killAt[id] == fmt.Sprintf("%d:%s", batch, phase) {
			say("reached %s %d %s", id, batch, phase)
			select {} // until SIGKILL
		}
	}
	// batch applies the batch that starts at from, or finds it recorded.
	batch := func(ctx context.Context, lease jobs.Lease, from int64) (int64, error) {
		k := from / faultBatch
		tx, err := pool.Begin(ctx)
		if err != nil {
			return 0, err
		}
		defer func() { _ = tx.Rollback(ctx) }()
		res, err := store.Advance(ctx, tx, lease, "batch-"+strconv.FormatInt(k, 10), from, faultBatch)
		if err != nil {
			return 0, err
		}
		if res.Replayed {
			if from >= lease.Cursor {
				say("violation: job %s batch %d at or after the lease's cursor %d answered Replayed", lease.JobID, k, lease.Cursor)
			}
			return res.Cursor, nil
		}
		if from < lease.Cursor {
			say("violation: job %s batch %d before the lease's cursor %d was applied again", lease.JobID, k, lease.Cursor)
		}
		if _, err := tx.Exec(ctx, `INSERT INTO items (job_id, item, generation) SELECT $1, i, $2 FROM generate_series($3::int8, $4::int8) AS i`,
			lease.JobID, lease.Generation, from, from+faultBatch-1); err != nil {
			return 0, err
		}
		stopAt(lease.JobID, k, "written")
		if err := tx.Commit(ctx); err != nil {
			return 0, err
		}
		stopAt(lease.JobID, k, "committed")
		return res.Cursor, nil
	}
	guard := queue.NewGuard(store, markers, queue.WithWorker(name))
	srv := asynq.NewServerFromRedisClient(rdb, asynq.Config{
		Queues: map[string]int{os.Getenv(envWorkerQueue): 1}, Concurrency: 4, LogLevel: asynq.FatalLevel, IsFailure: queue.IsFailure,
		// A retry (here: of an attempt whose worker was killed) is due at
		// once, and found within 100 ms.
		RetryDelayFunc:           func(int, error, *asynq.Task) time.Duration { return 0 },
		DelayedTaskCheckInterval: 100 * time.Millisecond,
		TaskCheckInterval:        100 * time.Millisecond,
	})
	mux := asynq.NewServeMux()
	mux.Use(guard.Middleware())
	mux.HandleFunc("report.export", func(ctx context.Context, _ *asynq.Task) error {
		lease, err := jobs.LeaseFromContext(ctx)
		if err != nil {
			return err
		}
		say("claimed %s generation %d cursor %d", lease.JobID, lease.Generation, lease.Cursor)
		cursor := lease.Cursor
		// A resumed attempt first sends the batch before its cursor again,
		// as a worker that restarts one batch early does: it must be
		// answered Replayed and write nothing.
		if cursor >= faultBatch {
			if _, err := batch(ctx, lease, cursor-faultBatch); err != nil {
				return err
			}
		}
		for cursor < lease.Total {
			if cursor, err = batch(ctx, lease, cursor); err != nil {
				return err
			}
		}
		if _, err := store.CompleteWith(ctx, pool, lease, nil); err != nil {
			return err
		}
		say("completed %s generation %d", lease.JobID, lease.Generation)
		return nil
	})
	if err := srv.Start(mux); err != nil {
		t.Fatal(err)
	}
	say("started %s", name)
	select {} // until SIGKILL or the parent's exit
}

// workerChild is a running TestFaultWorkerProcess.
type workerChild struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	exited chan struct{}
	stderr *jobstest.SyncBuffer

	mu   sync.Mutex
	said []string      // every line of its stdout so far
	news chan struct{} // a line was added
}

// startWorkerChild starts a worker process named name that stops at
// killAt (envFaultWorkerKillAt's format). Its "violation" lines are test
// errors, counted in violations. It is killed at cleanup.
func startWorkerChild(t *testing.T, f *faultFixture, srv *redistest.Server, name, killAt string, violations *atomic.Int64) *workerChild {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestFaultWorkerProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), envWorkerDB+"="+f.db.URL, envWorkerSchema+"="+f.db.Schema, envWorkerRedis+"="+srv.Addr,
		envWorkerQueue+"="+faultQueue, envFaultWorkerName+"="+name, envFaultWorkerKillAt+"="+killAt)
	c := &workerChild{cmd: cmd, exited: make(chan struct{}), stderr: &jobstest.SyncBuffer{}, news: make(chan struct{}, 1)}
	cmd.Stderr = c.stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if c.stdin, err = cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(c.exited)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			line := sc.Text()
			if strings.HasPrefix(line, "violation") {
				violations.Add(1)
				t.Errorf("worker %s: %s", name, line)
			}
			c.mu.Lock()
			c.said = append(c.said, line)
			c.mu.Unlock()
			select {
			case c.news <- struct{}{}:
			default: // a wake-up is pending already
			}
		}
		_ = cmd.Wait()
	}()
	t.Cleanup(func() {
		_ = c.stdin.Close()
		_ = cmd.Process.Kill()
		<-c.exited
		if t.Failed() {
			c.mu.Lock()
			defer c.mu.Unlock()
			t.Logf("worker %s stdout:\n%s\nstderr:\n%s", name, strings.Join(c.said, "\n"), c.stderr.String())
		}
	})
	return c
}

// saidLine returns the first line the process said that starts with
// prefix.
func (c *workerChild) saidLine(prefix string) (string, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, l := range c.said {
		if strings.HasPrefix(l, prefix) {
			return l, true
		}
	}
	return "", false
}

// await waits until the process has said a line that starts with prefix,
// at any time since its start.
func (c *workerChild) await(t *testing.T, prefix string) string {
	t.Helper()
	deadline := time.After(faultWait)
	for {
		if line, ok := c.saidLine(prefix); ok {
			return line
		}
		select {
		case <-c.news:
		case <-c.exited:
			if line, ok := c.saidLine(prefix); ok {
				return line
			}
			t.Fatalf("the worker process exited while the test waited for %q:\n%s", prefix, c.stderr.String())
		case <-deadline:
			t.Fatalf("timed out after %s waiting for the worker process to say %q", faultWait, prefix)
		}
	}
}

// kill sends SIGKILL and waits for the process to end.
func (c *workerChild) kill(t *testing.T) {
	t.Helper()
	if err := c.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatalf("SIGKILL: %v", err)
	}
	<-c.exited
}

// killPointIn draws where an attempt that resumes at cursor stops: one of
// the next three batches, with its rows written and its transaction open,
// or just committed (never the last batch committed, so that every
// attempt has a batch left to be killed in). It returns the point
// (envFaultWorkerKillAt's format) and the cursor the job must have once
// the attempt is killed there.
func killPointIn(rng *rand.Rand, cursor int64) (string, int64) {
	last := int64(faultItems/faultBatch - 1)
	k := cursor/faultBatch + rng.Int64N(min(3, last-cursor/faultBatch+1))
	if k == last || rng.IntN(2) == 0 {
		return fmt.Sprintf("%d:written", k), k * faultBatch
	}
	return fmt.Sprintf("%d:committed", k), (k + 1) * faultBatch
}

// A worker process is killed with SIGKILL in the middle of a batch of
// resumable progress (its rows written, its transaction open) or just
// after one: attempts of job W-resumed, which has retries left, are
// killed by the first workerKills worker processes, each at a random
// batch; asynq's recoverer retries it (its lease made expired, as
// time passing would), the next worker process resumes at the cursor, and
// the last one completes it: every item written once, by the attempt
// that recorded its batch, the cursor never moved backwards. Job W-lost,
// killed on its only attempt by the first kill, is archived by asynq and
// reaped as lost_task once the stall rule holds, with its cascade and
// marker, its cursor and rows as the kill left them.
func TestReliabilityFaults_WorkerSIGKILLMidBatch(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	rng := faultRand(t)
	workerKills := faultServiceRounds(t) - 1
	f := newFaultFixture(t)
	f.db.Exec(t, `CREATE TABLE items (job_id text, item bigint, generation bigint NOT NULL, PRIMARY KEY (job_id, item))`)
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	store := f.db.Store()
	resumed, lost := "W-resumed", "W-lost"
	var violations atomic.Int64
	kills, rowsLost := 0, 0
	defer func() {
		jobstest.Figure(t, faultSuite, "worker_sigkill", kills)
		jobstest.Figure(t, faultSuite, "violations", int(violations.Load()))
		jobstest.Figure(t, faultSuite, "rows_lost", rowsLost)
	}()
	client := asynq.NewClientFromRedisClient(rdb)
	total := int64(faultItems)
	for id, retries := range map[string]int{resumed: workerKills, lost: 0} {
		f.db.Insert(t, jobstest.Job{ID: id, Type: "report.export", Status: jobs.StatusQueued, Queue: faultQueue, Total: &total})
		if _, err := queue.Enqueue(ctx, client, store, asynq.NewTask("report.export", nil), id, asynq.MaxRetry(retries)); err != nil {
			t.Fatal(err)
		}
	}
	// requireProgress checks a killed attempt's job: still PROCESSING at
	// its generation, the cursor where the kill point left it, one row
	// per item below the cursor and none above, each written by the
	// generation that recorded its batch.
	requireProgress := func(id string, generation, cursor int64, what string) {
		t.Helper()
		row := f.db.Read(t, id)
		items := f.db.Count(t, `SELECT count(*) FROM items WHERE job_id = $1`, id)
		below := f.db.Count(t, `SELECT count(*) FROM items WHERE job_id = $1 AND item < $2`, id, row.Cursor)
		foreign := f.db.Count(t, `SELECT count(*) FROM items i JOIN `+f.db.Table("job_batches")+` b
    ON b.job_id = i.job_id AND b.token = 'batch-' || (i.item / $2)
 WHERE i.job_id = $1 AND b.generation <> i.generation`, id, faultBatch)
		if row.Status != jobs.StatusProcessing || row.Generation != generation || row.Cursor != cursor ||
			items != row.Cursor || below != row.Cursor || foreign != 0 {
			violations.Add(1)
			t.Errorf("after %s: %s = %+v with %d item rows (%d below its cursor, %d not written by the generation that recorded their batch); "+
				"want PROCESSING at generation %d, cursor %d, one row per item below it", what, id, row, items, below, foreign, generation, cursor)
		}
		if below < row.Cursor {
			rowsLost += int(row.Cursor - below)
		}
	}
	// expireLeases makes the killed attempts' asynq leases expired by
	// over a minute, as time passing after the kill would (asynq's
	// recoverer takes tasks whose 30 s lease expired 30 s ago), so that
	// the next worker process's recoverer, which runs at its start, takes
	// them.
	expireLeases := func(ids ...string) {
		t.Helper()
		past := float64(time.Now().Add(-2 * time.Minute).Unix())
		for _, id := range ids {
			n, err := rdb.ZAddXX(ctx, "asynq:{"+faultQueue+"}:lease", redis.Z{Score: past, Member: id}).Result()
			if err != nil {
				t.Fatal(err)
			}
			_ = n // ZADD XX answers 0 for an updated member
			if s, err := rdb.ZScore(ctx, "asynq:{"+faultQueue+"}:lease", id).Result(); err != nil || s != past {
				t.Fatalf("the lease of %s: %v, %v; want it moved back", id, s, err)
			}
		}
	}

	cursor := int64(0)
	var cursors []int64
	for attempt := 1; attempt <= workerKills; attempt++ {
		at, want := killPointIn(rng, cursor)
		killAt := resumed + "=" + at
		var lostAt string
		var lostWant int64
		if attempt == 1 {
			lostAt, lostWant = killPointIn(rng, 0)
			killAt += "," + lost + "=" + lostAt
		}
		name := fmt.Sprintf("w-fault-%d", attempt)
		w := startWorkerChild(t, f, srv, name, killAt, &violations)
		w.await(t, "reached "+resumed)
		if attempt == 1 {
			w.await(t, "reached "+lost)
		}
		w.kill(t)
		kills++
		what := fmt.Sprintf("SIGKILL %d of worker %s (%s at batch %s)", kills, name, resumed, at)
		requireProgress(resumed, int64(attempt), want, what)
		if want < cursor {
			violations.Add(1)
			t.Errorf("after %s: the cursor moved backwards from %d to %d", what, cursor, want)
		}
		cursor = want
		cursors = append(cursors, cursor)
		expireLeases(resumed)
		if attempt == 1 {
			requireProgress(lost, 1, lostWant, what+" and "+lost+" at batch "+lostAt)
			expireLeases(lost)
		}
		violations.Add(int64(f.checkReaps(t, what)))
	}
	t.Logf("%s's cursor after each kill: %v", resumed, cursors)

	// The last worker process resumes W-resumed and completes it. It
	// stays up: the live asynq server of the queue, without which a
	// lost_task reap is held.
	w := startWorkerChild(t, f, srv, "w-fault-last", "", &violations)
	w.await(t, "completed "+resumed)
	row := f.db.Read(t, resumed)
	items := f.db.Count(t, `SELECT count(*) FROM items WHERE job_id = $1`, resumed)
	if row.Status != jobs.StatusCompleted || row.Cursor != faultItems || row.Generation != int64(workerKills+1) || items != faultItems {
		violations.Add(1)
		t.Errorf("%s = %+v with %d item rows; want COMPLETED at generation %d, cursor %d, %d rows", resumed, row, items, workerKills+1, faultItems, faultItems)
	}
	rowsLost += faultItems - int(items)
	if n := f.db.Count(t, `SELECT count(*) FROM `+f.db.Table("job_batches")+` WHERE job_id = $1`, resumed); n != faultItems/faultBatch {
		violations.Add(1)
		t.Errorf("%s has %d recorded batches, want %d", resumed, n, faultItems/faultBatch)
	}

	// W-lost: archived by the first recoverer after its kill; the pass
	// after the stall rule holds reaps it as lost_task.
	insp := asynq.NewInspectorFromRedisClient(rdb)
	waitUntil(t, faultWait, "asynq archives "+lost, func() bool {
		info, err := insp.GetTaskInfo(faultQueue, lost)
		return err == nil && info.State == asynq.TaskStateArchived
	})
	before := f.db.Read(t, lost)
	f.db.Exec(t, `UPDATE jobs SET started_at = now() - interval '31 minutes', updated_at = now() - interval '21 minutes' WHERE id = $1`, lost)
	r := run(t, "run", "--once", "--output", "json", "--config", f.config, "--database-url", f.db.URL, "--schema", f.db.Schema,
		"--redis-url", srv.URL, "--queues", faultQueue)
	requireExit(t, r, exitOK)
	if !strings.Contains(r.stdout, `"reaped_by":{"lost_task":1,"stalled":0}`) {
		violations.Add(1)
		t.Errorf("the pass after the stall rule holds: %s; want %s reaped as lost_task", r.stdout, lost)
	}
	after := f.db.Read(t, lost)
	lostItems := f.db.Count(t, `SELECT count(*) FROM items WHERE job_id = $1`, lost)
	if after.Status != jobs.StatusFailed || after.FailureReason != jobs.ReasonLostTask || after.Cursor != before.Cursor || lostItems != before.Cursor {
		violations.Add(1)
		t.Errorf("%s = %+v with %d item rows; want FAILED lost_task, cursor %d and its rows kept", lost, after, lostItems, before.Cursor)
	}
	violations.Add(int64(f.checkReaps(t, "the lost_task reap") + f.checkMarkers(t, rdb, lost, "the lost_task reap")))
}
