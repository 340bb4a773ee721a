// Package demo is `jobreaper demo`: a story told on real input, in well
// under a minute, that shows the problem jobreaper solves and its cure.
//
// It runs an asynq worker with the start guard in-process, enqueues jobs of
// types with limits of seconds (a demo-only configuration that still passes
// the daemon's validation), runs real reaper passes (reaper.RunOnce) and
// narrates on stdout what happened: a hung job reaped with its evidence,
// its marker and TTL, its redelivery refused by the start guard, its late
// completion refused with nothing written, a progressing job left alone and
// completed, and a course-flow job resumed from its cursor by a second
// attempt. Every narrated claim is checked against PostgreSQL and Redis, so
// the demo is also a smoke test of a deployment.
//
// The demo leaves nothing behind: its tables live in a schema of their own,
// its tasks in a queue of their own, and both are removed at exit, as are
// the markers of its jobs. Where no PostgreSQL or Redis answers it starts
// throwaway stand-ins (see Options).
package demo

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"
)

// Environment variables read when Options leaves a URL empty; the daemon
// reads the same ones.
const (
	EnvDatabaseURL = "JOBREAPER_DATABASE_URL"
	EnvRedisURL    = "JOBREAPER_REDIS_URL"
)

// Local defaults, used when neither Options nor the environment names a
// URL: the PostgreSQL and Redis of a developer machine on their standard
// ports.
const (
	DatabaseURLDefault = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"
	RedisURLDefault    = "redis://127.0.0.1:6379/0"
)

// Exit codes of Run.
const (
	// ExitStoryHeld: every narrated claim was checked and held.
	ExitStoryHeld = 0
	// ExitStoryBroke: a claim did not hold, or the demo could not clean up
	// after itself; stdout ends with "story broke: <reason>".
	ExitStoryBroke = 1
	// ExitCannotRun: the story could not start (no PostgreSQL or Redis and
	// no stand-in, a URL that answers but refuses the demo); one line on
	// stderr says why and what to do.
	ExitCannotRun = 2
)

// Options configure Run.
type Options struct {
	// DatabaseURL is the PostgreSQL the demo creates its throwaway schema
	// in (it needs CREATE on the database). Empty: JOBREAPER_DATABASE_URL,
	// else DatabaseURLDefault. When nothing answers at that address the
	// demo starts a throwaway PostgreSQL cluster from the server binaries
	// installed on the machine.
	DatabaseURL string
	// RedisURL is the Redis the demo's asynq queue lives in. Empty:
	// JOBREAPER_REDIS_URL, else RedisURLDefault. When nothing answers at
	// that address the demo starts an in-process stand-in (miniredis).
	RedisURL string
	// Verbose logs the components' info and debug lines to stderr; by
	// default only warnings and errors are logged.
	Verbose bool
	// TempDir is where a stand-in PostgreSQL cluster gets its throwaway
	// directory, removed at exit. Empty: os.TempDir(). When the demo runs
	// as root the cluster runs as the user nobody, which must be able to
	// reach this directory.
	TempDir string

	// findPostgres locates the PostgreSQL server binaries (nil: the
	// default search); tests replace it.
	findPostgres func() (pgBinaries, error)
}

// Run tells the story and returns an exit code: ExitStoryHeld,
// ExitStoryBroke or ExitCannotRun. The narration goes to stdout, logs to
// stderr. Run removes everything it created (schema, queue, markers,
// stand-ins and their directory) before it returns, also when ctx is
// cancelled.
func Run(ctx context.Context, opts Options, stdout, stderr io.Writer) int {
	stdout, stderr = &lockedWriter{w: stdout}, &lockedWriter{w: stderr}
	d := &demo{
		opts:  opts,
		out:   stdout,
		errw:  stderr,
		start: time.Now(),
		logs:  newLogs(stderr, opts.Verbose),
	}
	return d.run(ctx)
}

// demo is one run of the story.
type demo struct {
	opts  Options
	out   io.Writer
	errw  io.Writer
	start time.Time
	logs  logs
}

// logs are the loggers of the demo and of the product components it runs.
type logs struct {
	// demo is the demo's own logger.
	demo *slog.Logger
	// reaper receives the passes' logs.
	reaper *slog.Logger
	// guard and asynq are quieter: the guard's refusal of the reaped task
	// and asynq abandoning the hung handler at shutdown are warnings the
	// story provokes on purpose and narrates on stdout, so without
	// Verbose only their errors are logged.
	guard *slog.Logger
	asynq *slog.Logger
}

func newLogs(w io.Writer, verbose bool) logs {
	level, quiet := slog.LevelWarn, slog.LevelError
	if verbose {
		level, quiet = slog.LevelDebug, slog.LevelDebug
	}
	base := slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: level}))
	quietBase := slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: quiet}))
	return logs{
		demo:   base.With("component", "demo"),
		reaper: base,
		guard:  quietBase,
		asynq:  quietBase.With("component", "asynq"),
	}
}

// say writes one narrated line.
func (d *demo) say(format string, args ...any) {
	_, _ = fmt.Fprintf(d.out, format+"\n", args...)
}

// since formats the time elapsed since the demo started, for the pass
// lines.
func (d *demo) since() string {
	return fmt.Sprintf("+%.1fs", time.Since(d.start).Seconds())
}

// errCannotRun marks an error that kept the story from starting.
var errCannotRun = errors.New("cannot run")

func (d *demo) run(ctx context.Context) int {
	d.say("jobreaper demo: a hung job, its late result, a slow but live job and a resumed job, on asynq with the start guard and real reaper passes.")
	// Cleanup must run even when ctx was cancelled (Ctrl-C), with its own
	// bound so that a hung server cannot keep the demo from exiting.
	cleanupCtx := func() (context.Context, context.CancelFunc) {
		return context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	}
	cleanup := func(w *world, e *env) error {
		cctx, cancel := cleanupCtx()
		defer cancel()
		var errs []error
		if w != nil {
			errs = append(errs, w.close(cctx))
		}
		if e != nil {
			errs = append(errs, e.close(cctx))
		}
		return errors.Join(errs...)
	}

	env, err := d.startEnv(ctx)
	if err != nil {
		if cerr := cleanup(nil, env); cerr != nil {
			d.logs.demo.Error("cleaning up after a failed start", "err", cerr)
		}
		d.cannotRun(err)
		return ExitCannotRun
	}
	w, err := d.newWorld(ctx, env)
	if err != nil {
		if cerr := cleanup(w, env); cerr != nil {
			d.logs.demo.Error("cleaning up after a failed start", "err", cerr)
		}
		d.cannotRun(err)
		return ExitCannotRun
	}
	claims, storyErr := w.story(ctx)
	cleanupErr := cleanup(w, env)
	switch {
	case storyErr != nil && ctx.Err() != nil:
		d.say("story broke: interrupted before the story could finish (%v)", storyErr)
		return ExitStoryBroke
	case storyErr != nil:
		d.say("story broke: %v", storyErr)
		return ExitStoryBroke
	case cleanupErr != nil:
		d.say("story broke: the story held, but the demo could not remove what it created: %v", cleanupErr)
		return ExitStoryBroke
	}
	d.say("story held: %d claims checked against PostgreSQL and Redis; the demo's schema, queue, markers and stand-ins are removed.", claims)
	return ExitStoryHeld
}

// cannotRun writes err as the one line on stderr that says why the story
// could not start; the lines of a driver's multi-line error are joined.
func (d *demo) cannotRun(err error) {
	var b strings.Builder
	for _, l := range strings.Split(err.Error(), "\n") {
		if l = strings.TrimSpace(l); l == "" {
			continue
		}
		if b.Len() > 0 && !strings.HasSuffix(b.String(), ":") {
			b.WriteString(";")
		}
		if b.Len() > 0 {
			b.WriteString(" ")
		}
		b.WriteString(l)
	}
	_, _ = fmt.Fprintf(d.errw, "jobreaper demo: %s\n", b.String())
}

// getenvOr returns v, else the environment variable env, else def.
func getenvOr(v, env, def string) string {
	if v != "" {
		return v
	}
	if e := os.Getenv(env); e != "" {
		return e
	}
	return def
}

// lockedWriter serialises writes: the narration, the demo's logs and the
// components' logs come from several goroutines.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
