package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"slices"
	"strings"

	"github.com/hibiken/asynq"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/spf13/cobra"

	"github.com/jobreaper/jobreaper/config"
	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/queue"
	"github.com/jobreaper/jobreaper/reaper"
)

// Output formats of run --once.
const (
	outputText = "text"
	outputJSON = "json"
)

func (a *app) runCmd() *cobra.Command {
	var (
		once   bool
		output string
		mode   runMode
	)
	cmd := &cobra.Command{
		Use:   "run",
		Short: "Run the reaper: a daemon with a metrics server, or one pass with --once",
		Long: `run starts the reaper daemon: a pass at start (after up to --start-jitter),
then one every --interval, until SIGTERM or SIGINT. It serves /metrics and
/healthz on --metrics-addr, and /readyz (200 when the last PostgreSQL and
Redis checks succeeded, 503 naming the failing one). A failed pass is
logged and the next one runs.

run --once runs one pass, prints what it did on stdout and exits 0 if the
pass was clean, 1 if it counted errors, 2 if it could not run. With
--output json, stdout is exactly one JSON document: the summary
{"scanned":N,"reaped":N,"skipped":{...},"errors":N,"reaped_by":{"stalled":N,"lost_task":N},
"lost_limit_tripped":false,"stale_queued":N,"broken_active":N,"markers_restored":N,
"interrupted":false,"queues_not_found":[...]} (interrupted: a signal stopped the
pass before its end, exit 1), or, when the command
could not run once its flags were read (exit 2), {"error":"<message>"} with
the message also on stderr. --output applies to --once only.
Logs always go to stderr.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if cmd.Flags().Changed("output") && !once {
				return cannotRun("--output applies to --once only (the daemon prints no summary); add --once or drop --output")
			}
			if output != outputText && output != outputJSON {
				return cannotRun("--output %q is not a format: use text or json", output)
			}
			if mode.dryRun && !once {
				return cannotRun("--dry-run applies to --once only (a daemon that writes nothing would only load the servers); add --once")
			}
			if !once {
				cfg, err := a.loadConfig(cmd)
				if err != nil {
					return err
				}
				return a.runDaemon(cmd.Context(), cfg, newLogger(cfg, a.stderr), mode)
			}
			err := a.runOnceCmd(cmd, output, mode)
			if output == outputJSON {
				a.printJSONError(err)
			}
			return err
		},
	}
	config.RegisterFlags(cmd.Flags())
	cmd.Flags().BoolVar(&once, "once", false, "run one pass, print its summary and exit (0 clean, 1 errors, 2 could not run)")
	cmd.Flags().StringVar(&output, "output", outputText,
		`format of the --once summary on stdout: text or json (json: one document, {"error":"..."} when it could not run)`)
	mode.register(cmd)
	return cmd
}

// runOnceCmd loads the configuration and runs one pass.
func (a *app) runOnceCmd(cmd *cobra.Command, output string, mode runMode) error {
	cfg, err := a.loadConfig(cmd)
	if err != nil {
		return err
	}
	return a.runOnce(cmd.Context(), cfg, newLogger(cfg, a.stderr), output, mode)
}

// printJSONError keeps run --once --output json's promise of one JSON
// document on stdout when the command could not run (exit 2): it prints
// {"error":"<the one-line message>"}; execute prints the same message on
// stderr. Other outcomes have printed their summary already.
func (a *app) printJSONError(err error) {
	var ee *exitError
	if !errors.As(err, &ee) || ee.code != exitCannotRun || ee.err == nil {
		return
	}
	// Nothing else can be reported if stdout itself fails.
	_ = json.NewEncoder(a.stdout).Encode(struct {
		Error string `json:"error"`
	}{oneLine(ee.err.Error())})
}

// deps are what a pass runs on; close releases them.
type deps struct {
	reaper *reaper.Reaper
	pool   *pgxpool.Pool
	rdb    redis.UniversalClient
	close  func()
}

// connect opens PostgreSQL and Redis and builds the reaper. Every failure
// is an exit-2 error naming the server and what to check.
func connect(ctx context.Context, cfg config.Config, log *slog.Logger, mode runMode) (*deps, error) {
	// Every statement of the pool, the pass's, the leader lease's and the
	// readiness check's, tells the outage grace when connections were lost.
	watch := jobs.NewConnWatch(cfg.OpTimeout)
	pool, err := connectMigrated(ctx, cfg, watch.Install)
	if err != nil {
		return nil, err
	}
	rdb, err := connectRedis(ctx, cfg)
	if err != nil {
		pool.Close()
		return nil, err
	}
	closeAll := func() {
		closeWith(log.With("component", "main"), "Redis client", rdb.Close)
		pool.Close()
	}
	markers, err := queue.NewMarkerStore(rdb, queue.WithMarkerOpTimeout(cfg.OpTimeout))
	if err != nil {
		closeAll()
		return nil, cannotRun("%v", err)
	}
	lister, err := newLister(cfg, rdb)
	if err != nil {
		closeAll()
		return nil, cannotRun("%v; check --page-size", err)
	}
	leader := mode.leader(cfg, log)
	store := jobs.NewStore(pool, append(leader.storeOptions(),
		jobs.WithSchema(cfg.Schema), jobs.WithOpTimeout(cfg.OpTimeout), jobs.WithCascades(cfg.Cascades), jobs.WithConnWatch(watch))...)
	// A misspelt table in a cascade fails here, not at the first reap, and
	// so does a statement that would end the reap's transaction (ROLLBACK).
	if err := store.PrepareCascades(ctx); err != nil {
		closeAll()
		return nil, cannotRun("the cascades of the config file fail their start check against schema %q: %s; fix the statements named",
			cfg.Schema, joinProblems(err))
	}
	opts := reaper.Options{
		Queues:   cfg.Queues,
		Interval: cfg.Interval,
		Rule:     cfg.StallRule(),
		Logger:   log,
		Metrics:  mode.metrics,
		Eviction: queue.NewPolicyReader(rdb, cfg.OpTimeout),
		DryRun:   mode.dryRun,

		OutageGrace: cfg.OutageGraceOn(),

		MarkerCheckWindow: cfg.MarkerCheckWindow,
		MaxLostPerPass:    cfg.MaxLostPerPass,

		StaleQueuedAfter:   cfg.StaleQueuedAfter,
		StaleQueuedLookups: cfg.StaleQueuedLookupsPerPass,
		Asynq:              queue.NewStatusReader(rdb, cfg.OpTimeout),
	}
	if mode.daemon {
		opts.StartJitter = cfg.StartJitter
	} else {
		// run --once: an operator's one pass does all of its paced work.
		opts.Once = true
	}
	if err := mode.fleetOptions(&opts, store, leader, rdb, cfg, log); err != nil {
		closeAll()
		return nil, cannotRun("%v", err)
	}
	return &deps{reaper: reaper.New(store, lister, markers, opts), pool: pool, rdb: rdb, close: closeAll}, nil
}

// runOnce runs one pass and prints its summary on stdout. It never waits
// for the start jitter: an operator is watching.
func (a *app) runOnce(ctx context.Context, cfg config.Config, log *slog.Logger, output string, mode runMode) error {
	// A manual pass neither takes, waits for, nor checks the leader lease.
	mode.leaderLease, mode.daemon = false, false
	d, err := connect(ctx, cfg, log, mode)
	if err != nil && ctx.Err() != nil {
		// A signal during start-up, not a server or setting at fault: the
		// pass was stopped before it began.
		return a.stoppedOnce(log, reaper.Result{Interrupted: true}, output, mode)
	}
	if err != nil {
		return err
	}
	defer d.close()
	res, err := d.reaper.RunOnce(ctx)
	switch {
	case res.Interrupted:
		// Also when the stop came before the pass could list anything
		// (err set): a stopped pass, not one that could not run.
		return a.stoppedOnce(log, res, output, mode)
	case err != nil:
		return cannotRun("the pass could not run: %v; check that PostgreSQL and Redis are reachable and see the log above", err)
	}
	if err := a.printSummary(res, output, mode); err != nil {
		return err
	}
	if res.Errors > 0 {
		return &exitError{code: exitPassErrors}
	}
	return nil
}

// stoppedOnce prints the summary of a pass a signal stopped before its
// end (res.Interrupted) and returns its exit-1 error: what it did is in the
// summary, but it did not look at everything, so it is not clean.
func (a *app) stoppedOnce(log *slog.Logger, res reaper.Result, output string, mode runMode) error {
	if err := a.printSummary(res, output, mode); err != nil {
		return err
	}
	log.Warn("the pass was stopped by a signal before its end; run it again", "component", "main")
	return &exitError{code: exitPassErrors}
}

// printSummary prints res (a dry run's with its decisions) in output's
// format.
func (a *app) printSummary(res reaper.Result, output string, mode runMode) error {
	var err error
	if mode.dryRun {
		err = printDryRun(a.stdout, res, output)
	} else {
		err = printResult(a.stdout, res, output)
	}
	if err != nil {
		return cannotRun("writing the summary: %v", err)
	}
	return nil
}

// forScripts returns res with {} and [] rather than null where a field is
// empty, and both reasons in ReapedBy, for scripts reading the JSON.
func forScripts(res reaper.Result) reaper.Result {
	if res.Skipped == nil {
		res.Skipped = map[string]int{}
	}
	res.ReapedBy = maps.Clone(res.ReapedBy)
	if res.ReapedBy == nil {
		res.ReapedBy = map[string]int{}
	}
	if res.QueuesNotFound == nil {
		res.QueuesNotFound = []string{}
	}
	for _, reason := range []string{jobs.ReasonStalled, jobs.ReasonLostTask} {
		res.ReapedBy[reason] += 0 // both keys, always
	}
	return res
}

// printResult writes res as one JSON document or as one human line.
func printResult(w io.Writer, res reaper.Result, output string) error {
	res = forScripts(res)
	if output == outputJSON {
		return json.NewEncoder(w).Encode(res)
	}
	var skipped []string
	for _, reason := range slices.Sorted(maps.Keys(res.Skipped)) {
		skipped = append(skipped, fmt.Sprintf("%s %d", reason, res.Skipped[reason]))
	}
	total := 0
	for _, n := range res.Skipped {
		total += n
	}
	line := fmt.Sprintf("scanned %d active task(s): reaped %d", res.Scanned, res.Reaped)
	if res.Reaped > 0 {
		line += fmt.Sprintf(" (stalled %d, lost_task %d)", res.ReapedBy[jobs.ReasonStalled], res.ReapedBy[jobs.ReasonLostTask])
	}
	line += fmt.Sprintf(", skipped %d", total)
	if len(skipped) > 0 {
		line += " (" + strings.Join(skipped, ", ") + ")"
	}
	for _, extra := range []struct {
		name string
		n    int
	}{{"markers_restored", res.MarkersRestored}, {"stale_queued", res.StaleQueued}, {"broken_active", res.BrokenActive}} {
		if extra.n > 0 {
			line += fmt.Sprintf(", %s %d", extra.name, extra.n)
		}
	}
	if len(res.QueuesNotFound) > 0 {
		line += fmt.Sprintf(", queues not known to asynq %s (treated as empty: a typo, or the wrong Redis database?)",
			strings.Join(res.QueuesNotFound, " "))
	}
	if res.LostLimitTripped {
		line += ", lost_limit_tripped (no lost_task reaped: more than max_lost_per_pass; see the log)"
	}
	if res.Interrupted {
		line += ", interrupted (a signal stopped the pass before its end: run it again)"
	}
	line += fmt.Sprintf(", errors %d", res.Errors)
	if res.Errors > 0 {
		line += " (see the log on stderr; the next pass retries a failed queue listing, load, task lookup or reap " +
			"and re-sets a marker whose write failed; a reaped job's FAILED row refuses its task meanwhile)"
	}
	_, err := fmt.Fprintln(w, line)
	return err
}

// runDaemon runs the reaper loop and the metrics server until ctx is
// cancelled (SIGTERM, SIGINT) or the metrics server fails.
func (a *app) runDaemon(ctx context.Context, cfg config.Config, log *slog.Logger, mode runMode) error {
	mainLog := log.With("component", "main")
	reg := prometheus.NewRegistry()
	mode.metrics, mode.daemon = reaper.NewMetrics(reg), true
	d, err := connect(ctx, cfg, log, mode)
	if err != nil && ctx.Err() != nil {
		// SIGTERM or SIGINT during start-up: a stop, as after it.
		mainLog.Info("jobreaper stopped during start-up, before its first pass")
		return nil
	}
	if err != nil {
		return err
	}
	// Deferred last: the clients close after everything that uses them
	// has stopped (step 3 below).
	defer d.close()
	// The readiness checks run until the daemon stops (readyCtx) and are
	// waited for before the clients close.
	readyCtx, stopReady := context.WithCancel(ctx)
	ready := startReadiness(readyCtx, d.pool, d.rdb, cfg.OpTimeout, log)
	defer ready.stop()
	defer stopReady()
	srv, err := startMetricsServer(ctx, cfg.MetricsAddr, reg, ready, log)
	if err != nil {
		return err
	}
	if err := d.reaper.Start(ctx); err != nil {
		srv.stop(ctx, mainLog)
		return cannotRun("starting the reaper: %v", err)
	}
	mainLog.Info("jobreaper started", "schema", cfg.Schema, "queues", queuesAttr(cfg.Queues),
		"interval", cfg.Interval, "stall_timeout", cfg.StallTimeout, "min_stall_timeout", cfg.MinStallTimeout(),
		"metrics_addr", cfg.MetricsAddr, "leader_lease", mode.leaderLease, "cancel_on_reap", mode.cancelOnReap)

	var failure error
	select {
	case <-ctx.Done():
		mainLog.Info("stopping on signal")
	case err := <-srv.failed:
		failure = cannotRun("the metrics server on %s stopped: %v; the daemon stops with it so that it is restarted", cfg.MetricsAddr, err)
	}
	// Stop order:
	// 1. The reaper: no pass starts after this, and Stop waits for a
	//    running pass. Its context is cancelled, so a reap in flight rolls
	//    back (each reap is one transaction) and is redone by the next
	//    daemon; a committed reap's marker is still written, and if that
	//    write fails, a later pass re-sets it (the FAILED row refuses the
	//    task through the start guard meanwhile).
	d.reaper.Stop()
	// 2. The metrics server, after the last pass recorded its metrics, so
	//    that a scrape during shutdown still answers.
	srv.stop(ctx, mainLog)
	// 3. The Redis client and the PostgreSQL pool (deferred d.close), which
	//    nothing uses any more.
	if failure == nil {
		mainLog.Info("jobreaper stopped")
	}
	return failure
}

func queuesAttr(queues []string) string {
	if len(queues) == 0 {
		return "(every queue asynq knows)"
	}
	return strings.Join(queues, ",")
}

// newLister returns the lister cfg.Lister names. The Inspector shares rdb
// and is not closed itself: asynq refuses to close a shared connection;
// closing rdb is enough.
func newLister(cfg config.Config, rdb redis.UniversalClient) (reaper.Lister, error) {
	if cfg.Lister == config.ListerInspector {
		return queue.NewInspectorLister(asynq.NewInspectorFromRedisClient(rdb), queue.WithPageSize(cfg.PageSize))
	}
	return queue.NewIDLister(rdb, queue.WithPageSize(cfg.PageSize))
}
