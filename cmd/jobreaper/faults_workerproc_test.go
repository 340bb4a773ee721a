package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
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

// Environment of the worker process TestFaultWorkerProcess runs as.
const (
	envWorkerDB     = "JOBREAPER_TEST_WORKER_DATABASE_URL"
	envWorkerSchema = "JOBREAPER_TEST_WORKER_SCHEMA"
	envWorkerRedis  = "JOBREAPER_TEST_WORKER_REDIS_ADDR"
	envWorkerQueue  = "JOBREAPER_TEST_WORKER_QUEUE"
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
// TestReliabilityFaults_WorkerSIGKILLMidBatch with the variables above
// set, it is a worker process (an asynq server with the start guard)
// whose handler works through a job's items with
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
