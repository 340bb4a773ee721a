package demo

import (
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"strconv"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/redis/go-redis/v9"

	"github.com/jobreaper/jobreaper/internal/redact"
)

// probeTimeout bounds the check whether anything answers at an address:
// a local service answers within milliseconds.
const probeTimeout = time.Second

// env is where the story runs: the URLs it uses and the stand-ins started
// for it.
type env struct {
	databaseURL, redisURL string
	// pg and mini are nil unless a stand-in was started.
	pg   *pgCluster
	mini *miniredis.Miniredis
}

// close stops the stand-ins and removes the cluster's directory.
func (e *env) close(ctx context.Context) error {
	var errs []error
	if e.mini != nil {
		e.mini.Close()
	}
	if e.pg != nil {
		errs = append(errs, e.pg.stop(ctx))
	}
	return errors.Join(errs...)
}

// startEnv resolves the URLs (Options, environment, local defaults) and
// starts a stand-in where nothing answers. It returns the env (for close)
// also with an error, since a stand-in may already run. The error wraps
// errCannotRun.
func (d *demo) startEnv(ctx context.Context) (*env, error) {
	e := &env{
		databaseURL: getenvOr(d.opts.DatabaseURL, EnvDatabaseURL, DatabaseURLDefault),
		redisURL:    getenvOr(d.opts.RedisURL, EnvRedisURL, RedisURLDefault),
	}

	pgNet, pgAddr, err := postgresAddr(e.databaseURL)
	if err != nil {
		return e, err
	}
	if answers(ctx, pgNet, pgAddr) {
		d.say("PostgreSQL: %s", redact.URL(e.databaseURL))
	} else {
		find := d.opts.findPostgres
		if find == nil {
			find = findPostgres
		}
		bins, err := find()
		if err != nil {
			return e, fmt.Errorf("%w: PostgreSQL: nothing answers at %s and %w", errCannotRun, pgAddr, err)
		}
		pg, err := startCluster(ctx, bins, d.opts.TempDir, d.logs.demo)
		if err != nil {
			return e, fmt.Errorf("%w: PostgreSQL: nothing answers at %s and the throwaway cluster from %s did not start: %w",
				errCannotRun, pgAddr, bins.dir, err)
		}
		e.pg, e.databaseURL = pg, pg.url
		d.say("PostgreSQL: nothing answers at %s; started a throwaway cluster (%s, run as %s) in %s, removed at exit",
			pgAddr, bins.describe(ctx), pg.runAs, pg.dir)
	}

	rNet, rAddr, err := redisAddr(e.redisURL)
	if err != nil {
		return e, err
	}
	if answers(ctx, rNet, rAddr) {
		d.say("Redis: %s", redact.URL(e.redisURL))
	} else {
		// asynq v0.26.0 runs on miniredis: its Lua scripts, the lease and
		// requeue paths and the Inspector calls the story uses all work
		// there (the story checks each outcome it narrates). miniredis does
		// not count TTLs down on its own, so the marker's TTL reads the
		// full 7 days however long after the reap it is read.
		m := miniredis.NewMiniRedis()
		if err := m.Start(); err != nil {
			return e, fmt.Errorf("%w: Redis: nothing answers at %s and the in-process stand-in did not start: %w", errCannotRun, rAddr, err)
		}
		e.mini, e.redisURL = m, "redis://"+m.Addr()+"/0"
		d.say("Redis: nothing answers at %s; started an in-process stand-in (miniredis) at %s", rAddr, m.Addr())
	}
	return e, nil
}

// postgresAddr returns the network and address a PostgreSQL URL connects
// to first: a TCP host:port, or the unix socket file in a socket
// directory.
func postgresAddr(databaseURL string) (network, addr string, err error) {
	cfg, err := pgconn.ParseConfig(databaseURL)
	if err != nil {
		// pgconn's errors can quote the URL, password included.
		return "", "", fmt.Errorf("%w: database URL %s is not a valid PostgreSQL URL: use postgres://user:password@host:5432/db",
			errCannotRun, redact.URL(databaseURL))
	}
	if filepath.IsAbs(cfg.Host) {
		return "unix", filepath.Join(cfg.Host, ".s.PGSQL."+strconv.Itoa(int(cfg.Port))), nil
	}
	return "tcp", net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port))), nil
}

// redisAddr returns the network and address of a Redis URL.
func redisAddr(redisURL string) (network, addr string, err error) {
	opt, err := redis.ParseURL(redisURL)
	if err != nil {
		return "", "", fmt.Errorf("%w: Redis URL %s is not valid: use redis://[:password@]host:port/db",
			errCannotRun, redact.URL(redisURL))
	}
	return opt.Network, opt.Addr, nil
}

// answers reports whether something accepts connections at addr. Only
// silence (refused, unreachable, timed out) starts a stand-in: a server
// that answers but refuses the demo is reported, not replaced.
func answers(ctx context.Context, network, addr string) bool {
	dctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	var dialer net.Dialer
	c, err := dialer.DialContext(dctx, network, addr)
	if err != nil {
		return false
	}
	_ = c.Close()
	return true
}
