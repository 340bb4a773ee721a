// Command worker is the worker process of the multi-process tests
// (package internal/fleettest builds and starts it): an asynq server
// behind the start guard, whose handler does what the job's payload, or
// the --kind flag, says:
//
//	complete   complete the job at once through CompleteWith
//	hang       do nothing until the handler's context ends (a reap's
//	           cancel, a shutdown), then return its error
//	heartbeat  heartbeat every --heartbeat-every through a
//	           jobs.Heartbeater with an advancing mark, for --run-for
//	           (0: until the context ends), then complete: a job that
//	           runs longer than its max_runtime and must not be reaped
//
// A payload of JSON {"kind": "...", "heartbeat_every": "200ms",
// "run_for": "5s"} overrides the flags per job (each field optional).
//
// It says what happens on stdout, one line each, for the test to await:
//
//	ready <name>
//	start <job id> generation <n> kind <kind>
//	completed <job id> generation <n>
//	returned <job id> generation <n>: <error>
//
// Its log (the guard's, asynq's warnings) goes to stderr. It exits 0 on
// SIGTERM or SIGINT after asynq's shutdown, and at once when its stdin
// closes (the test that started it is gone).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/hibiken/asynq"

	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/queue"
)

// Job kinds.
const (
	kindComplete  = "complete"
	kindHang      = "hang"
	kindHeartbeat = "heartbeat"
)

// settings are the flags, and what a payload may override.
type settings struct {
	Kind           string
	HeartbeatEvery time.Duration
	RunFor         time.Duration
}

// payload is a job's task payload; durations in Go syntax.
type payload struct {
	Kind           string `json:"kind"`
	HeartbeatEvery string `json:"heartbeat_every"`
	RunFor         string `json:"run_for"`
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintf(os.Stderr, "worker: %v\n", err)
		os.Exit(2)
	}
}

func run() error {
	var (
		databaseURL, schema, redisURL, queueName, name string
		concurrency                                    int
		heartbeatInterval, retryDelay, shutdownTimeout time.Duration
		def                                            settings
	)
	flag.StringVar(&databaseURL, "database-url", "", "PostgreSQL URL (required)")
	flag.StringVar(&schema, "schema", "public", "jobreaper's schema")
	flag.StringVar(&redisURL, "redis-url", "", "Redis URL (required)")
	flag.StringVar(&queueName, "queue", "", "the asynq queue to serve (required)")
	flag.StringVar(&name, "name", "worker", "the worker name the guard claims with")
	flag.IntVar(&concurrency, "concurrency", 4, "handlers at once")
	flag.DurationVar(&heartbeatInterval, "heartbeat-interval", time.Second,
		"the Heartbeater's least time between two writes of one attempt (the daemon's --heartbeat-interval)")
	flag.DurationVar(&retryDelay, "retry-delay", time.Second, "asynq's delay before a retry")
	flag.DurationVar(&shutdownTimeout, "shutdown-timeout", 3*time.Second, "asynq's ShutdownTimeout")
	flag.StringVar(&def.Kind, "kind", kindComplete, "what a job whose payload names no kind does: complete, hang or heartbeat")
	flag.DurationVar(&def.HeartbeatEvery, "heartbeat-every", 200*time.Millisecond, "the heartbeat kind's cadence")
	flag.DurationVar(&def.RunFor, "run-for", 0, "how long the heartbeat kind runs before it completes (0: until its context ends)")
	flag.Parse()
	if databaseURL == "" || redisURL == "" || queueName == "" {
		return errors.New("--database-url, --redis-url and --queue are required")
	}
	if _, err := kindOK(def.Kind); err != nil {
		return err
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	// The test holds our stdin: when it goes away, so do we.
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		os.Exit(0)
	}()
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo})).With("worker", name)

	pool, err := jobs.Connect(ctx, databaseURL, schema)
	if err != nil {
		return err
	}
	defer pool.Close()
	store := jobs.NewStore(pool, jobs.WithSchema(schema))
	hb, err := jobs.NewHeartbeater(store, nil, heartbeatInterval)
	if err != nil {
		return err
	}
	rdb, _, err := queue.NewRedisClient(redisURL, queue.RedisClientOptions{})
	if err != nil {
		return err
	}
	defer rdb.Close()
	markers, err := queue.NewMarkerStore(rdb)
	if err != nil {
		return err
	}
	guard := queue.NewGuard(store, markers, queue.WithWorker(name), queue.WithLogger(logger))
	srv := asynq.NewServerFromRedisClient(rdb, asynq.Config{
		Queues: map[string]int{queueName: 1}, Concurrency: concurrency, IsFailure: queue.IsFailure,
		RetryDelayFunc:           func(int, error, *asynq.Task) time.Duration { return retryDelay },
		TaskCheckInterval:        100 * time.Millisecond,
		DelayedTaskCheckInterval: 100 * time.Millisecond,
		ShutdownTimeout:          shutdownTimeout,
		LogLevel:                 asynq.WarnLevel,
	})
	w := &worker{store: store, hb: hb, def: def}
	if err := srv.Start(guard.Middleware()(asynq.HandlerFunc(w.handle))); err != nil {
		return err
	}
	say("ready %s", name)
	<-ctx.Done()
	srv.Shutdown()
	w.running.Wait()
	return nil
}

// say writes one line on stdout; lines of concurrent handlers never mix.
var sayMu sync.Mutex

func say(format string, args ...any) {
	sayMu.Lock()
	defer sayMu.Unlock()
	fmt.Printf(format+"\n", args...)
}

func kindOK(kind string) (string, error) {
	switch kind {
	case kindComplete, kindHang, kindHeartbeat:
		return kind, nil
	}
	return "", fmt.Errorf("kind %q: want complete, hang or heartbeat", kind)
}

type worker struct {
	store   *jobs.Store
	hb      *jobs.Heartbeater
	def     settings
	running sync.WaitGroup
}

// settingsOf returns the flags' settings overridden by the payload's.
func (w *worker) settingsOf(task *asynq.Task) (settings, error) {
	s := w.def
	if len(task.Payload()) == 0 {
		return s, nil
	}
	var p payload
	if err := json.Unmarshal(task.Payload(), &p); err != nil {
		return s, fmt.Errorf("payload %q: %w", task.Payload(), err)
	}
	var err error
	if p.Kind != "" {
		if s.Kind, err = kindOK(p.Kind); err != nil {
			return s, err
		}
	}
	for _, d := range []struct {
		raw string
		to  *time.Duration
	}{{p.HeartbeatEvery, &s.HeartbeatEvery}, {p.RunFor, &s.RunFor}} {
		if d.raw == "" {
			continue
		}
		if *d.to, err = time.ParseDuration(d.raw); err != nil {
			return s, fmt.Errorf("payload duration %q: %w", d.raw, err)
		}
	}
	return s, nil
}

// handle runs behind the start guard: the lease is in ctx.
func (w *worker) handle(ctx context.Context, task *asynq.Task) error {
	w.running.Add(1)
	defer w.running.Done()
	lease, err := jobs.LeaseFromContext(ctx)
	if err != nil {
		return err
	}
	s, err := w.settingsOf(task)
	if err != nil {
		return fmt.Errorf("%w: %w", err, asynq.SkipRetry)
	}
	say("start %s generation %d kind %s", lease.JobID, lease.Generation, s.Kind)
	err = w.work(ctx, lease, s)
	if err != nil {
		say("returned %s generation %d: %v", lease.JobID, lease.Generation, err)
		return err
	}
	say("completed %s generation %d", lease.JobID, lease.Generation)
	return nil
}

func (w *worker) work(ctx context.Context, lease jobs.Lease, s settings) error {
	switch s.Kind {
	case kindHang:
		<-ctx.Done()
		return ctx.Err()
	case kindHeartbeat:
		tick := time.NewTicker(s.HeartbeatEvery)
		defer tick.Stop()
		var end <-chan time.Time
		if s.RunFor > 0 {
			end = time.After(s.RunFor)
		}
		for mark := int64(1); ; mark++ {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-end:
				return w.complete(ctx, lease)
			case <-tick.C:
				// Refused (reaped, reclaimed) ends the attempt; a failed
				// write (PostgreSQL away) is retried at the next tick.
				if _, err := w.hb.Heartbeat(ctx, lease, mark); errors.Is(err, jobs.ErrStaleWorker) || errors.Is(err, jobs.ErrJobTerminal) {
					return err
				}
			}
		}
	}
	return w.complete(ctx, lease)
}

func (w *worker) complete(ctx context.Context, lease jobs.Lease) error {
	_, err := w.store.CompleteWith(ctx, nil, lease, nil)
	return err
}
