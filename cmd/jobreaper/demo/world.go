package demo

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/jobreaper/jobreaper/config"
	"github.com/jobreaper/jobreaper/internal/asynqstate"
	"github.com/jobreaper/jobreaper/internal/pgcore"
	"github.com/jobreaper/jobreaper/internal/pgstore"
	"github.com/jobreaper/jobreaper/internal/redact"
	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/queue"
	"github.com/jobreaper/jobreaper/reaper"
)

// The demo's limits: seconds instead of minutes, so the story fits in well
// under a minute. They pass config.Validate like a daemon's: the stall
// timeout is exactly 2 x heartbeat interval + interval, and the hard
// timeout is far longer than max_runtime + stall timeout.
const (
	demoInterval          = time.Second
	demoHeartbeatInterval = time.Second
	demoStallTimeout      = 3 * time.Second
	demoMaxRuntime        = 2 * time.Second
	demoHardTimeout       = time.Hour
)

// Job types of the story.
const (
	typeHung     = "demo.hung"
	typeProgress = "demo.progress"
	typeFinish   = "demo.finish"
	typeCourse   = "course.publish"
)

// courseLessons is the course flow's total: lessons published one batch
// each.
const courseLessons = 4

// demoSQL creates the product tables the story's handlers write, in the
// demo's schema, next to jobreaper's own. The demo's statements name that
// schema themselves ({schema}, see world.sql), as jobreaper's do: they work
// the same through a transaction-mode pooler.
const demoSQL = `
CREATE TABLE {schema}.demo_reports (job_id text NOT NULL, generation bigint NOT NULL, body text NOT NULL);
CREATE TABLE {schema}.demo_lessons (job_id text NOT NULL, lesson int NOT NULL, generation bigint NOT NULL);`

// jobIDs are the story's job IDs; a random suffix keeps them, and so their
// markers, apart from any other run's on the same Redis.
type jobIDs struct {
	hung, progress, finish, course string
}

func (j jobIDs) all() []string { return []string{j.hung, j.progress, j.finish, j.course} }

// world is what the story runs against: the demo's schema and queue, the
// clients, and the workers it started.
type world struct {
	d       *demo
	cfg     config.Config
	schema  string
	queue   string
	ids     jobIDs
	pool    *pgxpool.Pool
	store   *jobs.Store
	rdb     *redis.Client
	markers *queue.MarkerStore
	insp    *asynq.Inspector
	client  *asynq.Client
	reaper  *reaper.Reaper
	h       *handlers
	workers []*worker
	// migrated is set once the schema may exist, so close drops it.
	migrated bool
}

// newWorld validates the demo configuration, creates the schema with
// jobs.Migrate, the job types, the product tables and the job rows. It
// returns the world (for close) also with an error.
func (d *demo) newWorld(ctx context.Context, e *env) (*world, error) {
	suffix := randomSuffix()
	w := &world{
		d:      d,
		schema: "jobreaper_demo_" + suffix,
		queue:  "jobreaper-demo-" + suffix,
		ids: jobIDs{
			hung: "demo-hung-" + suffix, progress: "demo-progress-" + suffix,
			finish: "demo-finish-" + suffix, course: "demo-course-" + suffix,
		},
	}
	w.cfg = config.Config{
		DatabaseURL:       e.databaseURL,
		RedisURL:          e.redisURL,
		Schema:            w.schema,
		Queues:            []string{w.queue},
		Interval:          demoInterval,
		StallTimeout:      demoStallTimeout,
		HeartbeatInterval: demoHeartbeatInterval,
		MetricsAddr:       config.MetricsAddrOff,
	}.WithDefaults()
	if err := w.cfg.Validate(); err != nil {
		return nil, fmt.Errorf("%w: the demo configuration does not pass validation: %w", errCannotRun, err)
	}

	pool, err := jobs.Connect(ctx, w.cfg.DatabaseURL, w.schema)
	if err != nil {
		return nil, fmt.Errorf("%w: %w (set %s to a PostgreSQL URL the demo may create a schema in)", errCannotRun, err, EnvDatabaseURL)
	}
	w.pool, w.store = pool, jobs.NewStore(pool, jobs.WithSchema(w.schema))
	ropt, err := redis.ParseURL(w.cfg.RedisURL)
	if err != nil {
		return w, fmt.Errorf("%w: Redis URL %s: %w", errCannotRun, redact.URL(w.cfg.RedisURL), err)
	}
	w.rdb = redis.NewClient(ropt)
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	err = w.rdb.Ping(pctx).Err()
	cancel()
	if err != nil {
		return w, fmt.Errorf("%w: Redis at %s answers but refuses the demo: %w (set %s)", errCannotRun, redact.URL(w.cfg.RedisURL), err, EnvRedisURL)
	}
	if w.markers, err = queue.NewMarkerStore(w.rdb); err != nil {
		return w, fmt.Errorf("%w: %w", errCannotRun, err)
	}
	w.insp = asynq.NewInspectorFromRedisClient(w.rdb)
	w.client = asynq.NewClientFromRedisClient(w.rdb)
	lister, err := asynqstate.NewInspectorLister(w.insp, asynqstate.WithPageSize(w.cfg.PageSize))
	if err != nil {
		return w, fmt.Errorf("%w: %w", errCannotRun, err)
	}
	// The status reader tells the passes which queues live asynq servers
	// serve (the demo's worker serves its queue): marker re-assertion and
	// lost-task reaps are held without one, as the daemon's are.
	w.reaper = reaper.New(pgstore.New(pool, pgstore.WithSchema(w.schema)), lister, asynqstate.NewMarkerWriter(w.rdb, 0), reaper.Options{
		Queues: w.cfg.Queues, Interval: w.cfg.Interval, Rule: w.cfg.StallRule(), Logger: d.logs.reaper, OutageGrace: w.cfg.OutageGraceOn(),
		Asynq:             asynqstate.NewStatusReader(w.rdb, w.cfg.OpTimeout),
		MaxStalledPerPass: w.cfg.MaxStalledPerPass, MaxStalledFraction: w.cfg.MaxStalledFraction,
		StallStormHold: w.cfg.StallStormHold,
	})
	hb, err := jobs.NewHeartbeater(w.store, nil, w.cfg.HeartbeatInterval)
	if err != nil {
		return w, fmt.Errorf("%w: %w", errCannotRun, err)
	}
	w.h = newHandlers(w.store, w.pool, hb)

	// Set before Migrate: a migration that fails halfway may have created
	// the schema already.
	w.migrated = true
	if _, err := jobs.Migrate(ctx, w.pool, w.schema); err != nil {
		return w, fmt.Errorf("%w: %w", errCannotRun, err)
	}
	// The workers' start-up check, as a worker process would run it.
	if err := w.store.CheckSchema(ctx); err != nil {
		return w, fmt.Errorf("%w: %w", errCannotRun, err)
	}
	if err := w.seed(ctx); err != nil {
		return w, fmt.Errorf("%w: seeding the demo schema %s: %w", errCannotRun, w.schema, err)
	}
	d.say("Demo schema %s (jobreaper's tables, migrated), asynq queue %s: both removed at exit.", w.schema, w.queue)
	d.say("Limits: max_runtime %s, stall timeout %s (= 2 x heartbeat interval %s + pass interval %s, the least the daemon accepts), hard_timeout %gh.",
		secs(demoMaxRuntime), secs(demoStallTimeout), secs(demoHeartbeatInterval), secs(demoInterval), demoHardTimeout.Hours())
	return w, nil
}

// seed writes the product tables, the job types and the four QUEUED jobs.
func (w *world) seed(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, jobs.OpTimeoutDefault)
	defer cancel()
	return pgx.BeginFunc(ctx, w.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, w.sql(demoSQL)); err != nil {
			return err
		}
		for _, typ := range []string{typeHung, typeProgress, typeFinish, typeCourse} {
			// stall_timeout NULL: the daemon-wide 3s applies.
			if _, err := tx.Exec(ctx, w.sql(`INSERT INTO {schema}.job_types (name, max_runtime, hard_timeout) VALUES ($1, $2, $3)`),
				typ, pgcore.Interval(demoMaxRuntime), pgcore.Interval(demoHardTimeout)); err != nil {
				return err
			}
		}
		for _, j := range []struct {
			id, typ string
			total   any
		}{{w.ids.hung, typeHung, nil}, {w.ids.progress, typeProgress, nil}, {w.ids.finish, typeFinish, nil}, {w.ids.course, typeCourse, courseLessons}} {
			if _, err := tx.Exec(ctx, w.sql(`INSERT INTO {schema}.jobs (id, type, status, queue, total) VALUES ($1, $2, 'QUEUED', $3, $4)`),
				j.id, j.typ, w.queue, j.total); err != nil {
				return err
			}
		}
		return nil
	})
}

// enqueue enqueues every job's task through queue.Enqueue (row first,
// then task).
func (w *world) enqueue(ctx context.Context) error {
	for _, j := range []struct{ id, typ string }{
		{w.ids.hung, typeHung}, {w.ids.progress, typeProgress}, {w.ids.finish, typeFinish}, {w.ids.course, typeCourse},
	} {
		if _, err := queue.Enqueue(ctx, w.client, w.store, asynq.NewTask(j.typ, nil), j.id); err != nil {
			return err
		}
	}
	return nil
}

// close removes everything the demo created, in order: the hung handler
// is released and the workers stopped (so no handler writes any more and
// no task is active), then the queue, the demo's markers and the schema
// go, then the clients close.
func (w *world) close(ctx context.Context) error {
	var errs []error
	if w.h != nil {
		w.h.releaseHung()
	}
	for _, wk := range w.workers {
		wk.shutdown()
	}
	if w.h != nil && !w.h.wait(10*time.Second) {
		errs = append(errs, errors.New("a handler was still running 10s after the workers stopped"))
	}
	if w.rdb != nil {
		errs = append(errs, w.removeQueue(ctx))
	}
	if w.pool != nil {
		if w.migrated {
			dctx, cancel := context.WithTimeout(ctx, jobs.OpTimeoutDefault)
			if _, err := w.pool.Exec(dctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{w.schema}.Sanitize()+" CASCADE"); err != nil {
				errs = append(errs, fmt.Errorf("dropping schema %s: %w", w.schema, err))
			}
			cancel()
		}
		w.pool.Close()
	}
	if w.rdb != nil {
		_ = w.rdb.Close()
	}
	return errors.Join(errs...)
}

// removeQueue deletes the demo's asynq queue with its tasks, any key
// asynq keeps for it (daily counters), and the markers of the demo's jobs.
// jobreaper itself never deletes a marker (only expiry removes one); these
// are throwaway keys of the demo's own jobs, which no task will ask about
// again.
func (w *world) removeQueue(ctx context.Context) error {
	var errs []error
	if err := w.insp.DeleteQueue(w.queue, true); err != nil && !errors.Is(err, asynq.ErrQueueNotFound) {
		errs = append(errs, fmt.Errorf("deleting asynq queue %s: %w", w.queue, err))
	}
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	keys := make([]string, 0, len(w.ids.all()))
	for _, id := range w.ids.all() {
		keys = append(keys, queue.MarkerKey(id))
	}
	// asynq's keys of a queue all start with "asynq:{<queue>}".
	iter := w.rdb.Scan(rctx, 0, "asynq:{"+w.queue+"}*", 1000).Iterator()
	for iter.Next(rctx) {
		keys = append(keys, iter.Val())
	}
	if err := iter.Err(); err != nil {
		errs = append(errs, fmt.Errorf("listing the keys of queue %s: %w", w.queue, err))
	}
	if err := w.rdb.Del(rctx, keys...).Err(); err != nil {
		errs = append(errs, fmt.Errorf("deleting the demo's Redis keys: %w", err))
	}
	if err := w.rdb.SRem(rctx, "asynq:queues", w.queue).Err(); err != nil {
		errs = append(errs, fmt.Errorf("removing queue %s from asynq:queues: %w", w.queue, err))
	}
	return errors.Join(errs...)
}

// worker is one in-process asynq server with the start guard.
type worker struct {
	name string
	srv  *asynq.Server
	// outcomes records, per task ID, what the guard and handler returned
	// to asynq.
	outcomes *outcomes
	stopped  bool
}

// startWorker starts an asynq server named name on the demo's queue, with
// the start guard in front of the story's handlers.
func (w *world) startWorker(name string) (*worker, error) {
	guard := queue.NewGuard(w.store, w.markers, queue.WithWorker(name), queue.WithLogger(w.d.logs.guard))
	level := asynq.ErrorLevel
	if w.d.opts.Verbose {
		level = asynq.InfoLevel
	}
	srv := asynq.NewServerFromRedisClient(w.rdb, asynq.Config{
		Queues:      map[string]int{w.queue: 1},
		Concurrency: 8,
		// Short waits so the story moves in seconds: asynq polls an empty
		// queue every 200ms, moves retries due every 200ms, retries a failed
		// task after 500ms, and gives running handlers 500ms at shutdown
		// before it pushes their tasks back to the queue.
		TaskCheckInterval:        200 * time.Millisecond,
		DelayedTaskCheckInterval: 200 * time.Millisecond,
		RetryDelayFunc:           func(int, error, *asynq.Task) time.Duration { return 500 * time.Millisecond },
		ShutdownTimeout:          500 * time.Millisecond,
		IsFailure:                queue.IsFailure,
		Logger:                   asynqLogger{w.d.logs.asynq},
		LogLevel:                 level,
	})
	wk := &worker{name: name, srv: srv, outcomes: newOutcomes()}
	mux := asynq.NewServeMux()
	// The recorder wraps the guard, so it sees what the guard returned
	// when it refused a task without running the handler.
	mux.Use(w.h.track, wk.outcomes.middleware, guard.Middleware())
	w.h.register(mux, name)
	if err := srv.Start(mux); err != nil {
		return nil, fmt.Errorf("starting worker %s: %w", name, err)
	}
	w.workers = append(w.workers, wk)
	return wk, nil
}

// shutdown stops the worker; asynq pushes tasks whose handlers are still
// running after ShutdownTimeout back to their queue.
func (wk *worker) shutdown() {
	if !wk.stopped {
		wk.stopped = true
		wk.srv.Shutdown()
	}
}

// asynqLogger sends asynq's logs to slog.
type asynqLogger struct{ l *slog.Logger }

func (a asynqLogger) Debug(args ...any) { a.l.Debug(fmt.Sprint(args...)) }
func (a asynqLogger) Info(args ...any)  { a.l.Info(fmt.Sprint(args...)) }
func (a asynqLogger) Warn(args ...any)  { a.l.Warn(fmt.Sprint(args...)) }
func (a asynqLogger) Error(args ...any) { a.l.Error(fmt.Sprint(args...)) }

// Fatal logs at error level; asynq calls it only where it cannot go on,
// and exiting the process is the demo's decision, not asynq's.
func (a asynqLogger) Fatal(args ...any) { a.l.Error(fmt.Sprint(args...)) }

func randomSuffix() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// secs formats d in seconds with one decimal ("3.2s"), the unit of the
// story.
func secs(d time.Duration) string {
	return fmt.Sprintf("%.1fs", d.Seconds())
}
