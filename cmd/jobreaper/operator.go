package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/user"
	"regexp"
	"strconv"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/spf13/cobra"

	"github.com/jobreaper/jobreaper/config"
	"github.com/jobreaper/jobreaper/internal/asynqstate"
	"github.com/jobreaper/jobreaper/internal/pgstore"
	"github.com/jobreaper/jobreaper/queue"
	"github.com/jobreaper/jobreaper/reaper"
)

// opsDeps are what an operator command works with; close releases them.
type opsDeps struct {
	store *pgstore.Store
	rdb   redis.UniversalClient // nil for commands that use only PostgreSQL
	// markers reads markers (inspect); writer writes them (cancel).
	markers *queue.MarkerStore
	writer  *asynqstate.MarkerWriter
	close   func()
}

// connectOps opens PostgreSQL (and Redis when withRedis) for an operator
// command and checks the schema is migrated; with cascades, the config
// file's cascades are checked and run by the Store. Every failure is an
// exit-2 error naming the server and what to check.
func connectOps(ctx context.Context, cfg config.Config, log *slog.Logger, withRedis, cascades bool) (*opsDeps, error) {
	pool, err := connectMigrated(ctx, cfg)
	if err != nil {
		return nil, err
	}
	opts := []pgstore.Option{pgstore.WithSchema(cfg.Schema), pgstore.WithOpTimeout(cfg.OpTimeout)}
	if cascades {
		opts = append(opts, pgstore.WithCascades(cfg.Cascades))
	}
	d := &opsDeps{store: pgstore.New(pool, opts...), close: pool.Close}
	if cascades {
		if err := d.store.PrepareCascades(ctx); err != nil {
			pool.Close()
			return nil, cannotRun("the cascades of the config file fail their start check against schema %q: %s; fix the statements named",
				cfg.Schema, joinProblems(err))
		}
		warnCascadesDiffer(ctx, d.store, cfg, log)
	}
	if !withRedis {
		return d, nil
	}
	if err := d.attachRedis(ctx, cfg, log); err != nil {
		d.close()
		return nil, err
	}
	return d, nil
}

// warnCascadesDiffer warns when the daemon leading a queue set of this
// schema runs other cascades than the command's configuration (typically
// none, when --config was left out): the command then runs the
// statements it has, not the daemon's, so a product status the daemon's
// on_failed or on_requeued would set is left as it was. The check reads
// the leader lease rows; when it cannot read them it says nothing.
func warnCascadesDiffer(ctx context.Context, store *pgstore.Store, cfg config.Config, log *slog.Logger) {
	digests, err := store.LeaderCascadeDigests(ctx)
	if err != nil {
		return
	}
	mine := reaper.CascadesDigest(cfg.Cascades)
	for _, d := range digests {
		if d != mine {
			log.Warn("the daemon leading this schema runs other cascades than this command (pass the daemon's --config): "+
				"this command runs only its own on_failed and on_requeued statements",
				"component", "main", "leader_cascades_digest", d, "cascades_digest", mine, "cascades_types", len(cfg.Cascades))
			return
		}
	}
}

// openOps loads cmd's settings (keys), makes the command's logger and
// connects as connectOps does; its errors are loadConfig's and
// connectOps's.
func (a *app) openOps(cmd *cobra.Command, keys []string, withRedis, cascades bool) (*opsDeps, config.Config, *slog.Logger, error) {
	cfg, err := a.loadConfig(cmd, keys...)
	if err != nil {
		return nil, cfg, nil, err
	}
	log := newLogger(cfg, a.stderr)
	d, err := connectOps(cmd.Context(), cfg, log, withRedis, cascades)
	return d, cfg, log, err
}

// attachRedis connects d to Redis: d.rdb, d.markers and d.writer. On failure d is
// unchanged and the error is connectRedis's exit-2 error (or the marker
// store's), naming the server and what to check.
func (d *opsDeps) attachRedis(ctx context.Context, cfg config.Config, log *slog.Logger) error {
	rdb, err := connectRedis(ctx, cfg)
	if err != nil {
		return err
	}
	markers, err := queue.NewMarkerStore(rdb, queue.WithMarkerOpTimeout(cfg.OpTimeout))
	if err != nil {
		_ = rdb.Close()
		return cannotRun("%v", err)
	}
	closePG := d.close
	d.rdb, d.markers, d.writer = rdb, markers, asynqstate.NewMarkerWriter(rdb, cfg.OpTimeout)
	d.close = func() {
		closeWith(log.With("component", "main"), "Redis client", rdb.Close)
		closePG()
	}
	return nil
}

// taskLookup returns asynq's view of single tasks over d's Redis.
func (d *opsDeps) taskLookup(cfg config.Config) (asynqstate.TaskLookup, error) {
	l, err := asynqstate.NewInspectorLister(asynq.NewInspectorFromRedisClient(d.rdb), asynqstate.WithPageSize(cfg.PageSize))
	if err != nil {
		return nil, cannotRun("%v", err)
	}
	return l, nil
}

// operatorName says who runs an operator command, for its event:
// user@host, or what is known of it.
func operatorName() string {
	name := "unknown"
	if u, err := user.Current(); err == nil && u.Username != "" {
		name = u.Username
	}
	if h, err := os.Hostname(); err == nil && h != "" {
		name += "@" + h
	}
	return name
}

func (a *app) pruneCmd() *cobra.Command {
	var (
		olderThan string
		dryRun    bool
	)
	cmd := &cobra.Command{
		Use:   "prune --older-than DURATION [--dry-run]",
		Short: "Delete the events and batch records of jobs that finished before now - DURATION (at least 8 days)",
		Long: `prune deletes the job_events and job_batches rows of jobs that finished
(COMPLETED or FAILED) before the database's now() minus --older-than, in
batches of at most 10,000 rows, and prints the counts. It never deletes jobs
rows: they are the product's. Each run (also one that deleted nothing;
not a dry run) is recorded as one row of prune_runs (when, --older-than, the cutoff, the counts per table,
whether it ran to its end, who ran it). --older-than takes Go durations
plus a day suffix (8d, 720h, 10d12h) and must be at least 8 days: a reaped
job's marker lives 7 days in Redis, and the job keeps its whole history
while it may, with a day of margin. --dry-run prints the counts, deletes
and records nothing. It contacts only PostgreSQL.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			age, err := parseAge(olderThan)
			if err != nil {
				return cannotRun("--older-than %q: %v", olderThan, err)
			}
			if age < pgstore.PruneMinAge {
				return &exitError{code: exitPassErrors, err: fmt.Errorf(
					"refused: --older-than %s is less than 8 days; a reaped job's marker lives 7 days, and its history is kept for a day more; nothing deleted", olderThan)}
			}
			d, _, _, err := a.openOps(cmd, config.PruneKeys, false, false)
			if err != nil {
				return err
			}
			defer d.close()
			res, err := d.store.Prune(cmd.Context(), pgstore.PruneParams{OlderThan: age, DryRun: dryRun, Operator: operatorName()})
			verb := "deleted"
			if dryRun {
				verb = "would delete"
			}
			line := fmt.Sprintf("%s %d event(s) and %d batch record(s) of jobs finished before %s", verb, res.Events, res.Batches,
				res.Cutoff.UTC().Format(time.RFC3339))
			if err != nil {
				fmt.Fprintln(a.stdout, line)
				return &exitError{code: exitPassErrors, err: fmt.Errorf("prune stopped: %s; what was deleted is counted above, run it again", oneLine(err.Error()))}
			}
			fmt.Fprintln(a.stdout, line)
			return nil
		},
	}
	config.RegisterFlags(cmd.Flags(), config.PruneKeys...)
	cmd.Flags().StringVar(&olderThan, "older-than", "", "prune the history of jobs finished before now minus this (Go duration or days: 8d, 720h; at least 8d)")
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "print the counts, delete nothing")
	_ = cmd.MarkFlagRequired("older-than")
	return cmd
}

// dayPrefix matches a leading day count of an --older-than value ("8d",
// "10d12h").
var dayPrefix = regexp.MustCompile(`^(\d+)d(.*)$`)

// parseAge parses a Go duration with an optional leading day count (24 h
// each): 8d, 8d12h, 720h. Negative values are refused.
func parseAge(s string) (time.Duration, error) {
	var days time.Duration
	rest := s
	if m := dayPrefix.FindStringSubmatch(s); m != nil {
		n, err := strconv.Atoi(m[1])
		if err != nil || n > 100000 {
			return 0, fmt.Errorf("the day count is out of range")
		}
		days, rest = time.Duration(n)*24*time.Hour, m[2]
		if rest == "" {
			return days, nil
		}
	}
	d, err := time.ParseDuration(rest)
	if err != nil {
		return 0, fmt.Errorf("not a duration: use Go syntax with an optional day count, such as 8d, 10d12h or 720h")
	}
	if d < 0 {
		return 0, fmt.Errorf("a duration must not be negative")
	}
	return days + d, nil
}
