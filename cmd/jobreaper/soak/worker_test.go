package soak

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/queue"
)

// Environment of the worker process TestSoakWorkerProcess runs as.
const (
	envSoakDB     = "JOBREAPER_TEST_SOAK_DATABASE_URL"
	envSoakSchema = "JOBREAPER_TEST_SOAK_SCHEMA"
	envSoakRedis  = "JOBREAPER_TEST_SOAK_REDIS_ADDR"
	envSoakQueue  = "JOBREAPER_TEST_SOAK_QUEUE"
	envSoakWorker = "JOBREAPER_TEST_SOAK_WORKER"
)

// The soak's worker process: the worker library's heartbeat limiter at 1 s
// (the daemon runs with the same --heartbeat-interval), 8 handlers per
// process, and asynq's retries after 1 s, checked every 200 ms, so that a
// retried job does not wait asynq's default backoff of up to minutes.
const (
	soakHeartbeatInterval = time.Second
	soakConcurrency       = 8
	soakRetryDelay        = time.Second
	// soakBatch is the number of product rows (soak_items) one Advance
	// records; every job's total is a multiple of it.
	soakBatch = 5
	// soakStep is the simulated work of one batch, and the cadence of the
	// heartbeats of a long step.
	soakStep = 100 * time.Millisecond
	// soakWakePoll is how often a blocked handler reads its row, in case
	// the daemon's cancel of its context (cancel_on_reap) never arrives.
	soakWakePoll = time.Second
	// soakLateWrites bounds the late writes of a handler that outlived its
	// reap.
	soakLateWrites = 30 * time.Second
)

// soakPayload is the task payload the soak's enqueuer sends.
type soakPayload struct {
	// LongMS is the length of the long step of a normal or flaky job: work
	// that commits no batch, kept alive by heartbeats whose mark advances.
	LongMS int `json:"long_ms"`
}

// TestSoakWorkerProcess is not a test: run as a child process of
// TestReliabilitySoak with the variables above set, it is one worker
// process of the soak's fleet (an asynq server with the start guard and
// the soak's handlers, see soakWorker) until SIGTERM. Without them it
// returns at once.
func TestSoakWorkerProcess(t *testing.T) {
	url := os.Getenv(envSoakDB)
	if url == "" {
		return
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	schema := os.Getenv(envSoakSchema)
	pool, err := jobs.Connect(ctx, url+"&pool_max_conns=6", schema)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	// Late results are refused while the handler holds its transaction;
	// their events go through a pool of their own (see jobs.WithEventsDB).
	events, err := jobs.Connect(ctx, url+"&pool_max_conns=2", schema)
	if err != nil {
		t.Fatal(err)
	}
	defer events.Close()
	store := jobs.NewStore(pool, jobs.WithSchema(schema), jobs.WithCascades(soakCascades()), jobs.WithEventsDB(events))
	if err := store.PrepareCascades(ctx); err != nil {
		t.Fatal(err)
	}
	hb, err := jobs.NewHeartbeater(store, nil, soakHeartbeatInterval)
	if err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: os.Getenv(envSoakRedis), ContextTimeoutEnabled: true})
	defer rdb.Close()
	markers, err := queue.NewMarkerStore(rdb)
	if err != nil {
		t.Fatal(err)
	}
	name := os.Getenv(envSoakWorker)
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})).With("worker", name)
	guard := queue.NewGuard(store, markers, queue.WithWorker(name), queue.WithLogger(logger))
	srv := asynq.NewServerFromRedisClient(rdb, asynq.Config{
		Queues: map[string]int{os.Getenv(envSoakQueue): 1}, Concurrency: soakConcurrency,
		RetryDelayFunc:           func(int, error, *asynq.Task) time.Duration { return soakRetryDelay },
		TaskCheckInterval:        200 * time.Millisecond,
		DelayedTaskCheckInterval: 200 * time.Millisecond,
		ShutdownTimeout:          3 * time.Second,
		LogLevel:                 asynq.ErrorLevel,
		IsFailure:                queue.IsFailure,
	})
	w := &soakWorker{store: store, pool: pool, hb: hb, log: logger}
	mux := asynq.NewServeMux()
	mux.Use(guard.Middleware())
	mux.HandleFunc("soak.", w.handle)
	if err := srv.Start(mux); err != nil {
		t.Fatal(err)
	}
	<-ctx.Done()
	srv.Shutdown()
	// asynq stops waiting for a handler whose context it cancelled; a late
	// handler still writes after that. The soak checks the rows once every
	// worker process has exited, so wait for them all.
	handlersDone := make(chan struct{})
	go func() { w.running.Wait(); close(handlersDone) }()
	select {
	case <-handlersDone:
	case <-time.After(soakLateWrites + 10*time.Second):
		t.Errorf("handlers still running %s after the shutdown", soakLateWrites+10*time.Second)
	}
}

// soakWorker holds the handlers of the soak's job kinds. Each handler runs
// behind the start guard and uses the worker library as a product would:
// Advance with its product rows in one transaction, Heartbeat with an
// advancing mark, CompleteWith with the charge inside. What only the
// handler can see going wrong (a fenced write of a live attempt refused, a
// late write accepted, a replay not answered as one) goes into
// soak_anomalies, which the soak counts as violations.
type soakWorker struct {
	store *jobs.Store
	pool  *pgxpool.Pool
	hb    *jobs.Heartbeater
	log   *slog.Logger
	// running counts the handlers that have not returned, including those
	// asynq stopped waiting for.
	running sync.WaitGroup
}

func (w *soakWorker) handle(ctx context.Context, task *asynq.Task) error {
	w.running.Add(1)
	defer w.running.Done()
	lease, err := jobs.LeaseFromContext(ctx)
	if err != nil {
		return err
	}
	var p soakPayload
	if err := json.Unmarshal(task.Payload(), &p); err != nil {
		return fmt.Errorf("soak payload: %v: %w", err, asynq.SkipRetry)
	}
	a := &soakAttempt{w: w, lease: lease, cursor: lease.Cursor}
	first := lease.Generation == lease.FirstGeneration+1
	switch strings.TrimPrefix(task.Type(), "soak.") {
	case "normal":
		return a.run(ctx, p.LongMS)
	case "flaky":
		if first {
			// Two batches, then an error asynq retries: the next attempt
			// resumes at the cursor.
			if err := a.batches(ctx, 2); err != nil {
				return err
			}
			return errors.New("soak: transient failure, retried by asynq")
		}
		if err := a.replayLast(ctx); err != nil {
			return err
		}
		return a.run(ctx, p.LongMS)
	case "doomed":
		if err := a.batches(ctx, 1); err != nil {
			return err
		}
		return queue.Failure("soak_doomed", errors.New("soak: fails on every attempt"))
	case "stall":
		return a.stall(ctx)
	case "late":
		return a.late(ctx)
	}
	return fmt.Errorf("soak: no handler for %s: %w", task.Type(), asynq.SkipRetry)
}

// soakAttempt is one attempt of one job in a handler.
type soakAttempt struct {
	w      *soakWorker
	lease  jobs.Lease
	cursor int64
	mark   int64
}

// anomaly records what the handler saw go wrong, outside the handler's
// context (which may be cancelled by then).
func (a *soakAttempt) anomaly(ctx context.Context, what string, err error) {
	if err != nil {
		what += ": " + err.Error()
	}
	a.w.log.Error("soak anomaly", "job_id", a.lease.JobID, "generation", a.lease.Generation, "what", what)
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if _, err := a.w.pool.Exec(wctx, `INSERT INTO soak_anomalies (job_id, generation, what) VALUES ($1, $2, $3)`,
		a.lease.JobID, a.lease.Generation, what); err != nil {
		a.w.log.Error("soak anomaly not recorded", "job_id", a.lease.JobID, "err", err)
	}
}

// fenced reports whether err is the fence's refusal of a write.
func fenced(err error) bool {
	return errors.Is(err, jobs.ErrJobTerminal) || errors.Is(err, jobs.ErrStaleWorker)
}

// work simulates d of work; false when ctx ended first.
func work(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// failed handles a write of a progressing attempt that did not go through.
// The fence's refusal is an anomaly: nothing but this attempt may end the
// job while it progresses. Any other error (an overloaded database) is
// logged and returned: asynq retries the job, which resumes at its cursor.
func (a *soakAttempt) failed(ctx context.Context, what string, err error) {
	if fenced(err) {
		a.anomaly(ctx, what+" of a progressing attempt refused", err)
		return
	}
	if !errors.Is(err, context.Canceled) {
		a.w.log.Warn("soak: write failed; asynq retries the job", "job_id", a.lease.JobID, "what", what, "err", err)
	}
}

// heartbeat reports an advanced mark.
func (a *soakAttempt) heartbeat(ctx context.Context) error {
	a.mark++
	_, err := a.w.hb.Heartbeat(ctx, a.lease, a.mark)
	if err != nil {
		a.failed(ctx, "heartbeat", err)
	}
	return err
}

// batch records one batch of soakBatch product rows with Advance, in one
// transaction, and heartbeats.
func (a *soakAttempt) batch(ctx context.Context) error {
	if !work(ctx, soakStep) {
		return ctx.Err()
	}
	token := fmt.Sprintf("b%d", a.cursor/soakBatch)
	err := pgx.BeginFunc(ctx, a.w.pool, func(tx pgx.Tx) error {
		res, err := a.w.store.Advance(ctx, tx, a.lease, token, a.cursor, soakBatch)
		if err != nil {
			return err
		}
		if res.Replayed {
			a.anomaly(ctx, fmt.Sprintf("new batch %s at cursor %d answered as a replay", token, a.cursor), nil)
			return fmt.Errorf("new batch %s answered as a replay", token)
		}
		_, err = tx.Exec(ctx, `INSERT INTO soak_items (job_id, n) SELECT $1, n FROM generate_series($2::int8 + 1, $3::int8) AS n`,
			a.lease.JobID, a.cursor, res.Cursor)
		a.cursor = res.Cursor
		return err
	})
	if err != nil {
		a.failed(ctx, "batch "+token, err)
		return err
	}
	return a.heartbeat(ctx)
}

func (a *soakAttempt) batches(ctx context.Context, n int) error {
	for range n {
		if err := a.batch(ctx); err != nil {
			return err
		}
	}
	return nil
}

// replayLast sends the batch before the resumed cursor again, as a handler
// that cannot tell whether its last batch committed would: Advance must
// answer it as a replay of the stored cursor, and no product row is written.
func (a *soakAttempt) replayLast(ctx context.Context) error {
	if a.cursor < soakBatch {
		return nil
	}
	token := fmt.Sprintf("b%d", a.cursor/soakBatch-1)
	return pgx.BeginFunc(ctx, a.w.pool, func(tx pgx.Tx) error {
		res, err := a.w.store.Advance(ctx, tx, a.lease, token, a.cursor-soakBatch, soakBatch)
		switch {
		case err != nil:
			a.failed(ctx, "replay of batch "+token, err)
			return err
		case !res.Replayed || res.Cursor != a.cursor:
			a.anomaly(ctx, fmt.Sprintf("batch %s sent again: replayed=%v cursor=%d, want a replay at %d", token, res.Replayed, res.Cursor, a.cursor), nil)
		}
		return nil
	})
}

// run finishes a progressing job: its batches up to the total, with a long
// step of longMS in the middle (heartbeats with an advancing mark, no
// batch), then CompleteWith with the result row and the charge.
func (a *soakAttempt) run(ctx context.Context, longMS int) error {
	for a.cursor < a.lease.Total {
		if a.cursor == a.lease.Total/2/soakBatch*soakBatch && longMS > 0 {
			for end := time.Now().Add(time.Duration(longMS) * time.Millisecond); time.Now().Before(end); {
				if !work(ctx, soakStep) {
					return ctx.Err()
				}
				if err := a.heartbeat(ctx); err != nil {
					return err
				}
			}
			longMS = 0
		}
		if err := a.batch(ctx); err != nil {
			return err
		}
	}
	_, err := a.w.store.CompleteWith(ctx, a.w.pool, a.lease, a.completionWrites(ctx))
	if err != nil {
		a.failed(ctx, "completion", err)
	}
	return err
}

// completionWrites are the completion's product writes: its result row and
// its usage charge.
func (a *soakAttempt) completionWrites(ctx context.Context) func(pgx.Tx) error {
	return func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO soak_results (job_id, generation) VALUES ($1, $2)`, a.lease.JobID, a.lease.Generation); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO soak_charges (job_id) VALUES ($1)`, a.lease.JobID)
		return err
	}
}

// blocked waits, as a hung call would, until the handler's context is
// cancelled (the daemon cancels the handlers of the jobs it reaps) or the
// row is no longer PROCESSING at this generation. With idle set it keeps
// heartbeating the same mark meanwhile, as a ticker beside a hung call
// does: that must not keep the job alive.
func (a *soakAttempt) blocked(ctx context.Context, idle bool) {
	tick := time.NewTicker(300 * time.Millisecond)
	defer tick.Stop()
	lastPoll := time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		if idle {
			if _, err := a.w.hb.Heartbeat(ctx, a.lease, a.mark); fenced(err) {
				return
			}
		}
		if time.Since(lastPoll) >= soakWakePoll {
			lastPoll = time.Now()
			row, err := a.w.store.Get(ctx, a.lease.JobID)
			if err == nil && (row.Status != jobs.StatusProcessing || row.Generation != a.lease.Generation) {
				return
			}
		}
	}
}

// stall makes one batch, then hangs with an idle heartbeat ticker until it
// is reaped.
func (a *soakAttempt) stall(ctx context.Context) error {
	if err := a.batch(ctx); err != nil {
		return err
	}
	a.blocked(ctx, true)
	return errors.New("soak: the hung call returned after the reap")
}

// late makes one batch, hangs without heartbeats until it is reaped, then
// returns from its hung call and tries what a late worker would: a
// heartbeat with an advanced mark, one more batch with its product rows,
// and the completion with its result and charge. Each must be refused by
// the fence and change nothing; one that is not is an anomaly.
func (a *soakAttempt) late(ctx context.Context) error {
	if err := a.batch(ctx); err != nil {
		return err
	}
	a.blocked(ctx, false)
	lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), soakLateWrites)
	defer cancel()
	if res, err := a.w.hb.Heartbeat(lctx, a.lease, a.mark+1); !fenced(err) && !res.Throttled {
		a.anomaly(lctx, fmt.Sprintf("late heartbeat not refused (written=%v)", res.Written), err)
	}
	token := fmt.Sprintf("b%d", a.cursor/soakBatch)
	err := pgx.BeginFunc(lctx, a.w.pool, func(tx pgx.Tx) error {
		res, err := a.w.store.Advance(lctx, tx, a.lease, token, a.cursor, soakBatch)
		if err != nil {
			return err
		}
		_, err = tx.Exec(lctx, `INSERT INTO soak_items (job_id, n) SELECT $1, n FROM generate_series($2::int8 + 1, $3::int8) AS n`,
			a.lease.JobID, a.cursor, res.Cursor)
		return err
	})
	if !fenced(err) {
		a.anomaly(lctx, "late batch not refused", err)
	}
	_, err = a.w.store.CompleteWith(lctx, a.w.pool, a.lease, a.completionWrites(lctx))
	if !fenced(err) {
		a.anomaly(lctx, "late completion not refused", err)
	}
	return err
}
