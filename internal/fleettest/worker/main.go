// Command worker is the worker process of the multi-process tests
// (package internal/fleettest builds and starts it): an asynq server
// behind the start guard, serving the queues of --queue (comma-separated),
// whose handler does what the job's payload, or the --kind flag, says:
//
//	complete   complete the job at once through CompleteWith
//	hang       do nothing until the handler's context ends (a reap's
//	           cancel, a shutdown), then return its error
//	heartbeat  heartbeat every --heartbeat-every through a
//	           jobs.Heartbeater with an advancing mark, for --run-for
//	           (0: until the context ends or a finish command), then
//	           complete through CompleteWith: a job that runs longer than
//	           its max_runtime and must not be reaped. After --hang-after
//	           (0: never), or at a hang command, it stops heartbeating and
//	           does what hang does: a job that really stalled
//	fail       return queue.Failure(--code, an error): the job's handler
//	           failed with that code (FAILED with it on the last attempt,
//	           released for asynq's retry before)
//	error      return a plain error: released for asynq's retry while
//	           retries are left
//	nil        return nil without completing: COMPLETED for a type marked
//	           auto_complete, FAILED no_completion otherwise
//	completed  complete through CompleteWith, then return nil: a handler
//	           whose completion was confirmed before it returned
//	late       heartbeat as the heartbeat kind; once it hangs (after
//	           --hang-after or at a hang command) it waits until its
//	           context ends (the reap's cancel) or a minute passed, then
//	           completes anyway: a late result the fence must refuse
//
// With --charges TABLE, every completion inserts (job_id, generation) into
// TABLE in CompleteWith's transaction: a product write that must land at
// most once per job, and only with COMPLETED.
//
// A payload of JSON {"kind": "...", "heartbeat_every": "200ms",
// "run_for": "5s", "hang_after": "3s", "code": "upstream_down",
// "wait": true, "retry_kind": "complete", "ignore_cancel": true}
// overrides the flags per job (each field optional; durations in Go
// syntax). With "ignore_cancel", a heartbeat handler goes on (and a hang
// command hangs it) after its context ends: a handler that ignores
// asynq's cancel, as one cut off from Redis is cancelled when its task's
// lease expires. With "wait", the first
// attempt's handler says it waits and does nothing more until a go
// command names it: kinds fail, error and nil return then, complete
// completes then, completed returns nil then (it completed before
// waiting), so that a test can cut the worker's PostgreSQL before the
// handlers end. "retry_kind" is the kind of every later attempt (asynq's
// retry count above 0; default: the same kind), which never waits.
//
// Commands, one a line on stdin (the test's Worker.Tell), each answered by
// a line "did <command>: <n> handler(s)" once applied to the n handlers
// of the named job (or of every job, for "all") running then:
//
//	hang <job id>|all     a heartbeat handler stops heartbeating (it
//	                      hangs until its context ends)
//	finish <job id>|all   a heartbeat handler completes now
//	go <job id>|all       a waiting handler goes on
//
// It says what happens on stdout, one line each, for the test to await:
//
//	ready <name>
//	start <job id> generation <n> kind <kind>
//	waiting <job id> generation <n>
//	hung <job id> generation <n>
//	completed <job id> generation <n>
//	late <job id> generation <n>: <what the late completion returned>
//	returned <job id> generation <n>: <error, or <nil>>
//	did <command>: <n> handler(s)    (or: did <command>: <why not>)
//
// "completed" follows a confirmed CompleteWith (for kind completed, before
// the handler waits and returns nil); "returned" follows every handler's
// end, with what it returned.
//
// Its log (the guard's, asynq's warnings) goes to stderr. It exits 0 on
// SIGTERM or SIGINT after asynq's shutdown, and at once when its stdin
// closes (the test that started it is gone).
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jackc/pgx/v5"

	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/queue"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintf(os.Stderr, "worker: %v\n", err)
		os.Exit(2)
	}
}

func run() error {
	var (
		databaseURL, schema, redisURL, queues, name    string
		charges                                        string
		concurrency                                    int
		heartbeatInterval, retryDelay, shutdownTimeout time.Duration
		def                                            settings
	)
	flag.StringVar(&databaseURL, "database-url", "", "PostgreSQL URL (required)")
	flag.StringVar(&schema, "schema", "public", "jobreaper's schema")
	flag.StringVar(&redisURL, "redis-url", "", "Redis URL (required)")
	flag.StringVar(&queues, "queue", "", "the asynq queues to serve, comma-separated (required)")
	flag.StringVar(&name, "name", "worker", `the worker name the guard claims with ("": the guard's default, "<host>:<pid>")`)
	flag.StringVar(&charges, "charges", "", "a table (job_id text, generation bigint) of the schema each completion inserts its charge into")
	flag.IntVar(&concurrency, "concurrency", 4, "handlers at once")
	flag.DurationVar(&heartbeatInterval, "heartbeat-interval", time.Second,
		"the Heartbeater's least time between two writes of one attempt (the daemon's --heartbeat-interval)")
	flag.DurationVar(&retryDelay, "retry-delay", time.Second, "asynq's delay before a retry")
	flag.DurationVar(&shutdownTimeout, "shutdown-timeout", 3*time.Second, "asynq's ShutdownTimeout")
	flag.StringVar(&def.Kind, "kind", kindComplete, "what a job whose payload names no kind does: "+strings.Join(kinds, ", "))
	flag.DurationVar(&def.HeartbeatEvery, "heartbeat-every", 200*time.Millisecond, "the heartbeat kind's cadence")
	flag.DurationVar(&def.RunFor, "run-for", 0, "how long the heartbeat kind runs before it completes (0: until its context ends or a finish command)")
	flag.DurationVar(&def.HangAfter, "hang-after", 0, "how long the heartbeat kind heartbeats before it hangs (0: until a hang command)")
	flag.StringVar(&def.Code, "code", "handler_failed", "the fail kind's failure code")
	flag.Parse()
	weights := map[string]int{}
	for _, q := range strings.Split(queues, ",") {
		if q = strings.TrimSpace(q); q != "" {
			weights[q] = 1
		}
	}
	if databaseURL == "" || redisURL == "" || len(weights) == 0 {
		return errors.New("--database-url, --redis-url and --queue are required")
	}
	if _, err := kindOK(def.Kind); err != nil {
		return err
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
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
		Queues: weights, Concurrency: concurrency, IsFailure: queue.IsFailure,
		RetryDelayFunc:           func(int, error, *asynq.Task) time.Duration { return retryDelay },
		TaskCheckInterval:        100 * time.Millisecond,
		DelayedTaskCheckInterval: 100 * time.Millisecond,
		ShutdownTimeout:          shutdownTimeout,
		LogLevel:                 asynq.WarnLevel,
	})
	w := &worker{store: store, hb: hb, def: def, handlers: newRegistry()}
	if charges != "" {
		w.charges = pgx.Identifier{schema, charges}.Sanitize()
	}
	// The test holds our stdin: it sends commands there, and when it goes
	// away, so do we.
	go func() {
		sc := bufio.NewScanner(os.Stdin)
		for sc.Scan() {
			if line := strings.TrimSpace(sc.Text()); line != "" {
				n, err := w.handlers.command(line)
				if err != nil {
					say("did %s: %v", line, err)
					continue
				}
				say("did %s: %d handler(s)", line, n)
			}
		}
		os.Exit(0)
	}()
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
