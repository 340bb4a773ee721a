package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/spf13/cobra"

	"github.com/jobreaper/jobreaper/config"
	"github.com/jobreaper/jobreaper/internal/redact"
	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/queue"
)

// loadConfig loads and validates the configuration of cmd. With keys, only
// the problems of those settings count (see config.Only): a command that
// does not use a setting does not stop for it. Every problem is reported on
// one line, exit code 2, each naming the setting, its value, the rule and
// where the value came from (flag, environment variable, or file, line and
// key) when a source set it.
func (a *app) loadConfig(cmd *cobra.Command, keys ...string) (config.Config, error) {
	fs := cmd.Flags() // the command's own and its parents' persistent flags
	cfg, origins, err := config.LoadWithOrigins(config.Sources{
		File:    config.ConfigFile(fs, a.environ),
		Environ: a.environ,
		Flags:   fs,
	})
	only := func(err error) error {
		if keys == nil {
			return err
		}
		return config.Only(err, keys...)
	}
	// Validate once what was loaded is sound, so that a malformed value is
	// not also reported as its default breaking a rule.
	if err = only(err); err == nil {
		err = only(origins.Annotate(cfg.Validate()))
	}
	if err != nil {
		return config.Config{}, cannotRun("invalid configuration: %s", joinProblems(err))
	}
	return cfg, nil
}

// joinProblems puts the problems errors.Join collected on one line.
func joinProblems(err error) string {
	var j interface{ Unwrap() []error }
	if !errors.As(err, &j) {
		return err.Error()
	}
	parts := make([]string, 0, len(j.Unwrap()))
	for _, e := range j.Unwrap() {
		parts = append(parts, e.Error())
	}
	return strings.Join(parts, "; ")
}

// newLogger returns the logger every component gets: slog to w (stderr:
// stdout belongs to the command's output), at cfg's level and format, with
// durations written as Go durations ("3m0s") in both formats. Components
// add their own "component" attribute. It is passed down, never installed
// with slog.SetDefault: execute may run several times in one process (the
// tests), each with its own stderr.
func newLogger(cfg config.Config, w io.Writer) *slog.Logger {
	var level slog.Level
	// Validate accepted the level, so UnmarshalText cannot fail here.
	_ = level.UnmarshalText([]byte(cfg.LogLevel))
	opts := &slog.HandlerOptions{Level: level, ReplaceAttr: durationAsString}
	var log *slog.Logger
	if cfg.LogFormat == "json" {
		log = slog.New(slog.NewJSONHandler(w, opts))
	} else {
		log = slog.New(slog.NewTextHandler(w, opts))
	}
	return log
}

// durationAsString is the loggers' slog.HandlerOptions.ReplaceAttr: a
// time.Duration becomes its String ("3m0s", "1.5s"), which the text handler
// already writes but the JSON handler would write as integer nanoseconds.
func durationAsString(_ []string, a slog.Attr) slog.Attr {
	if a.Value.Kind() == slog.KindDuration {
		a.Value = slog.StringValue(a.Value.Duration().String())
	}
	return a
}

// connectPostgres opens the pool to cfg's database and schema, each of
// configure adjusting the pool's configuration first (the daemon's
// pgstore.ConnWatch). Errors name the database with its password redacted and
// say what to check.
func connectPostgres(ctx context.Context, cfg config.Config, configure ...func(*pgxpool.Config)) (*pgxpool.Pool, error) {
	pool, err := jobs.Connect(ctx, cfg.DatabaseURL, cfg.Schema, configure...)
	if err != nil {
		// jobs.Connect names the database with its password redacted;
		// scrub once more in case a driver message quoted it.
		reason := strings.TrimPrefix(err.Error(), "jobs.Connect: ")
		if pc, perr := pgconn.ParseConfig(cfg.DatabaseURL); perr == nil && pc.Password != "" {
			reason = strings.ReplaceAll(reason, pc.Password, "xxxxx")
		}
		if !strings.HasPrefix(reason, "cannot connect to PostgreSQL") {
			reason = "cannot connect to the PostgreSQL database: " + reason
		}
		if hint := tlsHint(err, postgresTLSSettings); hint != "" {
			return nil, cannotRun("%s; %s", oneLine(reason), hint)
		}
		return nil, cannotRun("%s; check --database-url (JOBREAPER_DATABASE_URL) and that the server is up", oneLine(reason))
	}
	return pool, nil
}

// connectMigrated opens the pool (connectPostgres) and checks its schema
// (requireMigrated), closing the pool when the check fails: what every
// command that runs jobreaper's statements starts with.
func connectMigrated(ctx context.Context, cfg config.Config, configure ...func(*pgxpool.Config)) (*pgxpool.Pool, error) {
	pool, err := connectPostgres(ctx, cfg, configure...)
	if err != nil {
		return nil, err
	}
	if err := requireMigrated(ctx, pool, cfg); err != nil {
		pool.Close()
		return nil, err
	}
	return pool, nil
}

// requireMigrated checks that the configured schema holds jobreaper's
// tables and every migration this binary ships, looking each table up by
// its qualified name (so the answer holds behind a transaction-mode
// pooler), so that a wrong --schema or a forgotten `jobreaper migrate` is
// reported before any pass instead of failing each one. It is the check a
// worker makes (jobs.Store.CheckSchema), bounded by the operation timeout.
func requireMigrated(ctx context.Context, pool *pgxpool.Pool, cfg config.Config) error {
	err := jobs.NewStore(pool, jobs.WithSchema(cfg.Schema), jobs.WithOpTimeout(cfg.OpTimeout)).CheckSchema(ctx)
	switch {
	case errors.Is(err, jobs.ErrNotMigrated):
		// The error names the schema, what is missing and the command; the
		// database (without its password) follows, so that the sentence
		// reads "schema "x" has no jobreaper tables ...; run ... (database
		// postgres://app@db:5432/app)".
		return cannotRun("%s (database %s)",
			strings.TrimSuffix(strings.TrimPrefix(err.Error(), "jobs.CheckSchema: "), ": "+jobs.ErrNotMigrated.Error()),
			redact.URL(cfg.DatabaseURL))
	case err != nil:
		return cannotRun("cannot read schema %q (database %s): %v; check the database and --schema",
			cfg.Schema, redact.URL(cfg.DatabaseURL), err)
	}
	return nil
}

// connectRedis opens a client to cfg's Redis and pings it. Every command
// is bounded by OpTimeout: the asynq Inspector takes no context, so the
// client's own timeouts are what bound its calls.
func connectRedis(ctx context.Context, cfg config.Config) (redis.UniversalClient, error) {
	redisLogOnce.Do(func() { redis.SetLogger(redisLog{}) })
	roots, err := redisRoots(cfg)
	if err != nil {
		return nil, err
	}
	// Without ContextTimeoutEnabled (which NewRedisClient sets) go-redis
	// ignores context deadlines, and the per-call timeouts of
	// the marker reader and writer would not bound a hung Redis.
	rdb, _, err := queue.NewRedisClient(cfg.RedisURL, queue.RedisClientOptions{RootCAs: roots,
		TLSServerName: cfg.RedisTLSServerName, OpTimeout: cfg.OpTimeout})
	if err != nil { // Validate parsed it already; kept for safety
		return nil, cannotRun("%v; check --redis-url (JOBREAPER_REDIS_URL)", err)
	}
	pctx, cancel := context.WithTimeout(ctx, cfg.OpTimeout)
	defer cancel()
	if err := rdb.Ping(pctx).Err(); err != nil {
		_ = rdb.Close()
		// Several sentinels' errors come joined, one a line.
		reason := oneLine(err.Error())
		if u, perr := url.Parse(cfg.RedisURL); perr == nil {
			if pw, ok := u.User.Password(); ok && pw != "" {
				reason = strings.ReplaceAll(reason, pw, "xxxxx")
			}
		}
		if hint := tlsHint(err, redisTLSSettings); hint != "" {
			return nil, cannotRun("cannot connect to Redis at %s: %s; %s", redact.URL(cfg.RedisURL), reason, hint)
		}
		check := "check --redis-url (JOBREAPER_REDIS_URL) and that the server is up"
		if strings.HasPrefix(cfg.RedisURL, "rediss://") && errors.Is(err, context.DeadlineExceeded) {
			// A TLS client whose handshake a plaintext server never answers
			// waits out the timeout: say so, since nothing else will.
			check += "; with rediss:// a server that does not speak TLS never answers the handshake (use redis:// for a plaintext server)"
		}
		return nil, &exitError{code: exitCannotRun, err: redisDownError{fmt.Errorf(
			"cannot connect to Redis at %s: %s; %s", redact.URL(cfg.RedisURL), reason, check)}}
	}
	return rdb, nil
}

// redisDownError is connectRedis's error when Redis did not answer its
// PING (down, unreachable, or a wrong address), as opposed to a setting it
// could not use (a CA file it cannot read, a certificate it does not
// trust). A command that can do without Redis goes on after the first
// kind only.
type redisDownError struct{ error }

func (e redisDownError) Unwrap() error { return e.error }

// redisLogOnce installs redisLog once per process: go-redis's logger is a
// global, so it cannot follow one command's logger.
var redisLogOnce sync.Once

// redisLog drops go-redis's own messages (a pool's dial retries, printed
// with the standard log package, not slog): each failure they describe
// also reaches jobreaper as a returned error, which is logged or reported
// with the context that says what it means. Without this, stderr would
// get unstructured duplicates of those errors.
type redisLog struct{}

func (redisLog) Printf(context.Context, string, ...any) {}

// closeWith runs close and logs its error: used in deferred stops.
func closeWith(log *slog.Logger, what string, close func() error) {
	if err := close(); err != nil {
		log.Warn("closing "+what+" failed", "err", fmt.Sprint(err))
	}
}
