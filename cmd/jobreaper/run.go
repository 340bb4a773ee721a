package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/spf13/cobra"

	"github.com/jobreaper/jobreaper/config"
	"github.com/jobreaper/jobreaper/internal/asynqstate"
	"github.com/jobreaper/jobreaper/internal/idcheck"
	"github.com/jobreaper/jobreaper/internal/pgstore"
	"github.com/jobreaper/jobreaper/jobs"
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
logged and the next one runs. A pass that panics is recovered, logged with
its stack and counted (jobreaper_passes_total{outcome="panicked"}), and the
next one runs; after 3 in a row the daemon releases its leader lease,
answers 503 on /readyz and /healthz for 5s and exits with code 3, so that
systemd (Restart=on-failure) or Kubernetes restarts it.

run --once runs one pass, prints what it did on stdout and exits 0 if the
pass was clean, 1 if it counted errors, panicked or held marker writes
(markers_held > 0: no live asynq server serves a queue of the pass in that
Redis, a wrong --redis-url looks the same, so no marker was written
there), or while a stall-storm hold is on for its queues (stall_storm_holds
not empty: too many active jobs went idle at once, so their queues' stalled
jobs are held until the hold ends; jobreaper release-hold ends it at once),
2 if it could not run (also, with --strict-queues, when a queue of
--queues is not known to asynq: the message names it with a did-you-mean).
With --output json, stdout is exactly one JSON document: the summary
{"scanned":N,"reaped":N,"skipped":{...},"errors":N,"reaped_by":{"stalled":N,"lost_task":N},
"lost_limit_tripped":false,"stale_queued":N,"broken_active":N,"markers_restored":N,
"interrupted":false,"panicked":false,"queues_not_found":[...],"scanned_by":{...},
"bad_queue_names":N,"markers_held":N,"queues_did_you_mean":{...},"uncovered_queues":{...},
"stall_storm_held":N,"stall_storm_holds":[...],"at_risk":N} (interrupted: a
signal stopped the pass before its end, exit 1; panicked: the pass ended at
a panic, exit 1; scanned_by: every scanned active task by outcome, adding up
to scanned; bad_queue_names: queue names no PostgreSQL text or metric label
can hold, skipped; uncovered_queues: queues asynq knows with stalled jobs that
neither a live leader lease's queue set nor this run's --queues covers, each
with its count; stall_storm_held: stalled jobs not reaped because a hold
holds their queues, each hold in stall_storm_holds; at_risk: jobs left
PROCESSING past max_runtime and idle for at least half their stall
timeout, with --dry-run also marked in each decision), or, when the command
could not run once its flags were read (exit 2), {"error":"<message>"} with
the message also on stderr. --output applies to --once only.
Logs always go to stderr.

A pass that would reap more than max_stalled_per_pass jobs as stalled, or
10 or more that are more than max_stalled_fraction of the active tasks it
judged, reaps none of them and records a stall-storm hold on their queues
(run --once may start one; --dry-run only says it would). On run --once,
--max-stalled-per-pass 0 on the command line lifts both limits for that
pass, unless --max-stalled-fraction is given there too (0 from the file or
the environment lifts max_stalled_per_pass only); a hold already recorded
is still honoured: release-hold ends it.`,
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
	cmd.Flags().BoolVar(&once, "once", false, "run one pass, print its summary and exit (0 clean; 1 errors, a panic, held marker writes, a stall-storm hold, the lost-task limit or an interruption; 2 could not run)")
	cmd.Flags().StringVar(&output, "output", outputText,
		`format of the --once summary on stdout: text or json (json: one document, {"error":"..."} when it could not run)`)
	mode.register(cmd)
	return cmd
}

// runOnceCmd loads the configuration and runs one pass.
func (a *app) runOnceCmd(cmd *cobra.Command, output string, mode runMode) error {
	cfg, err := a.loadConfig(cmd, config.RunOnceKeys...)
	if err != nil {
		return err
	}
	log := newLogger(cfg, a.stderr)
	if cmd.Flags().Changed("max-stalled-per-pass") && cfg.MaxStalledPerPass == 0 && !cmd.Flags().Changed("max-stalled-fraction") {
		// The operator's way to reap a storm on purpose, as
		// --max-lost-per-pass 0 is for lost tasks: both limits go.
		cfg.MaxStalledFraction = 0
		log.Info("--max-stalled-per-pass 0: this pass reaps stalled jobs without the stall-storm limits; "+
			"a hold already recorded still holds its queues (jobreaper release-hold ends it)", "component", "main")
	}
	return a.runOnce(cmd.Context(), cfg, log, output, mode)
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
	lister reaper.Lister
	// leader is the daemon's leader lease setup, for the status page.
	leader leaderSetup
	pool   *pgxpool.Pool
	rdb    redis.UniversalClient
	close  func()
}

// connect opens PostgreSQL and Redis and builds the reaper. Every failure
// is an exit-2 error naming the server and what to check.
func connect(ctx context.Context, cfg config.Config, log *slog.Logger, mode runMode) (*deps, error) {
	// Every statement of the pool, the pass's, the leader lease's and the
	// readiness check's, tells the outage grace when connections were lost.
	watch := pgstore.NewConnWatch(cfg.OpTimeout)
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
	markers := asynqstate.NewMarkerWriter(rdb, cfg.OpTimeout)
	lister, err := newLister(cfg, rdb)
	if err != nil {
		closeAll()
		return nil, cannotRun("%v; check --page-size", err)
	}
	leader := mode.leader(cfg, log)
	store := pgstore.New(pool, append(leader.storeOptions(),
		pgstore.WithSchema(cfg.Schema), pgstore.WithOpTimeout(cfg.OpTimeout), pgstore.WithCascades(cfg.Cascades), pgstore.WithConnWatch(watch))...)
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
		Eviction: asynqstate.NewPolicyReader(rdb, cfg.OpTimeout),
		DryRun:   mode.dryRun,

		OutageGrace: cfg.OutageGraceOn(),

		MarkerCheckWindow: cfg.MarkerCheckWindow,
		MaxLostPerPass:    cfg.MaxLostPerPass,

		MaxStalledPerPass:  cfg.MaxStalledPerPass,
		MaxStalledFraction: cfg.MaxStalledFraction,
		StallStormHold:     cfg.StallStormHold,

		StaleQueuedAfter:   cfg.StaleQueuedAfter,
		StaleQueuedLookups: cfg.StaleQueuedLookupsPerPass,
		Asynq:              asynqstate.NewStatusReader(rdb, cfg.OpTimeout),

		RedisName: redisName(cfg.RedisURL),
		Suggest:   config.Closest,
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
	return &deps{reaper: reaper.New(store, lister, markers, opts), lister: lister, leader: leader, pool: pool, rdb: rdb, close: closeAll}, nil
}

// runOnce runs one pass and prints its summary on stdout. It never waits
// for the start jitter: an operator is watching.
func (a *app) runOnce(ctx context.Context, cfg config.Config, log *slog.Logger, output string, mode runMode) error {
	// A manual pass neither takes, waits for, nor checks the leader lease.
	mode.leaderLease, mode.daemon = false, false
	redis := redisName(cfg.RedisURL)
	d, err := connect(ctx, cfg, log, mode)
	if err != nil && ctx.Err() != nil {
		// A signal during start-up, not a server or setting at fault: the
		// pass was stopped before it began.
		return a.stoppedOnce(log, reaper.Result{Interrupted: true}, output, mode, redis)
	}
	if err != nil {
		return err
	}
	defer d.close()
	if cfg.StrictQueues {
		if err := checkQueuesKnown(ctx, d.lister, cfg.Queues, redis); err != nil {
			return err
		}
	}
	res, err := d.reaper.RunOnce(ctx)
	switch {
	case res.Panicked:
		// Logged with its stack; what it did before is not known: never 0.
		if err := a.printSummary(res, output, mode, redis); err != nil {
			return err
		}
		return &exitError{code: exitPassErrors}
	case res.Interrupted:
		// Also when the stop came before the pass could list anything
		// (err set): a stopped pass, not one that could not run.
		return a.stoppedOnce(log, res, output, mode, redis)
	case err != nil:
		return cannotRun("the pass could not run: %v; check that PostgreSQL and Redis are reachable and see the log above", err)
	}
	if err := a.printSummary(res, output, mode, redis); err != nil {
		return err
	}
	// Held marker writes are not clean: the markers a reaped job's late
	// retry is refused by are missing there, or the Redis is the wrong one.
	// Nor is a stall-storm hold: stalled jobs wait on it, or on an operator.
	if res.Errors > 0 || res.MarkersHeld > 0 || len(res.StallStormHolds) > 0 {
		return &exitError{code: exitPassErrors}
	}
	return nil
}

// checkQueuesKnown returns, for --strict-queues, an exit-2 error naming
// each queue of queues that asynq does not know in the Redis the lister
// reads (named redis), each with a did-you-mean among the queues it
// knows; nil when every one is known, or when queues is empty (every
// queue). Nothing is written before it.
func checkQueuesKnown(ctx context.Context, lister reaper.Lister, queues []string, redis string) error {
	if len(queues) == 0 {
		return nil
	}
	all, err := lister.Queues(ctx)
	if err != nil {
		return cannotRun("--strict-queues: reading asynq's queue list in Redis %s failed: %v", redis, err)
	}
	known := slices.DeleteFunc(all, func(q string) bool { return idcheck.CheckName("queue name", q) != nil })
	var unknown []string
	for _, q := range queues {
		if slices.Contains(known, q) {
			continue
		}
		name := strconv.Quote(q)
		if near := config.Closest(q, known); near != "" {
			name += fmt.Sprintf(" (did you mean %q?)", near)
		}
		unknown = append(unknown, name)
	}
	if len(unknown) == 0 {
		return nil
	}
	return cannotRun("queue %s not known to asynq in Redis %s; --strict-queues refuses to run with an unknown queue: "+
		"fix --queues (JOBREAPER_QUEUES) or --redis-url (JOBREAPER_REDIS_URL)", strings.Join(unknown, ", "), redis)
}

// redisName names the Redis of a redis_url for logs and messages, never
// with its user or password: host:port/db (port 6379 when the URL has
// none, database 0 when it names none); a Sentinel URL by its first
// sentinel's address and database with the master's name, a Cluster URL
// by its first node, a unix:// URL by its socket path and database.
func redisName(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(a redis_url that does not parse)"
	}
	q := u.Query()
	if u.Scheme == "unix" {
		return "unix:" + u.Path + " db " + cmp.Or(q.Get("db"), "0")
	}
	host := u.Host
	if u.Port() == "" {
		host = net.JoinHostPort(u.Hostname(), "6379")
	}
	db := cmp.Or(strings.Trim(u.Path, "/"), "0")
	switch {
	case q.Has("master_name"):
		return fmt.Sprintf("%s/%s (Sentinel, master %s)", host, db, q.Get("master_name"))
	case q.Has("addr"):
		return host + " (Cluster)"
	}
	return host + "/" + db
}

// stoppedOnce prints the summary of a pass a signal stopped before its
// end (res.Interrupted) and returns its exit-1 error: what it did is in the
// summary, but it did not look at everything, so it is not clean.
func (a *app) stoppedOnce(log *slog.Logger, res reaper.Result, output string, mode runMode, redis string) error {
	if err := a.printSummary(res, output, mode, redis); err != nil {
		return err
	}
	log.Warn("the pass was stopped by a signal before its end; run it again", "component", "main")
	return &exitError{code: exitPassErrors}
}

// printSummary prints res (a dry run's with its decisions) in output's
// format; redis names the Redis the pass read.
func (a *app) printSummary(res reaper.Result, output string, mode runMode, redis string) error {
	var err error
	if mode.dryRun {
		err = printDryRun(a.stdout, res, output)
	} else {
		err = printResult(a.stdout, res, output, redis)
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
	if res.ScannedBy == nil {
		res.ScannedBy = map[string]int{}
	}
	if res.QueueSuggestions == nil {
		res.QueueSuggestions = map[string]string{}
	}
	if res.UncoveredQueues == nil {
		res.UncoveredQueues = map[string]int{}
	}
	res.ReapedBy = maps.Clone(res.ReapedBy)
	if res.ReapedBy == nil {
		res.ReapedBy = map[string]int{}
	}
	if res.QueuesNotFound == nil {
		res.QueuesNotFound = []string{}
	}
	if res.StallStormHolds == nil {
		res.StallStormHolds = []reaper.HoldReport{}
	}
	res.RetriedBy = maps.Clone(res.RetriedBy)
	if res.RetriedBy == nil {
		res.RetriedBy = map[string]int{}
	}
	if res.RetriesFinished == nil {
		res.RetriesFinished = map[string]int{}
	}
	for _, reason := range []string{jobs.ReasonStalled, jobs.ReasonLostTask} {
		res.ReapedBy[reason] += 0 // both keys, always
		res.RetriedBy[reason] += 0
	}
	return res
}

// printResult writes res as one JSON document or as one human line; the
// line names redis (the Redis the pass read) when marker writes were held.
func printResult(w io.Writer, res reaper.Result, output, redis string) error {
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
	if n := res.RetriedBy[jobs.ReasonStalled] + res.RetriedBy[jobs.ReasonLostTask]; n > 0 {
		line += fmt.Sprintf(", of them retried %d (stalled %d, lost_task %d)", n, res.RetriedBy[jobs.ReasonStalled], res.RetriedBy[jobs.ReasonLostTask])
	}
	line += fmt.Sprintf(", skipped %d", total)
	if len(skipped) > 0 {
		line += " (" + strings.Join(skipped, ", ") + ")"
	}
	for _, extra := range []struct {
		name string
		n    int
	}{{"markers_restored", res.MarkersRestored}, {"stale_queued", res.StaleQueued}, {"broken_active", res.BrokenActive}, {"at_risk", res.AtRisk},
		{"retries_reenqueued", res.RetriesFinished[reaper.RetryReenqueued]}, {"retry_cancels_resent", res.RetriesFinished[reaper.RetryCancelResent]},
		{"retries_failed_impossible", res.RetriesFinished[reaper.RetryFailedImpossible]}} {
		if extra.n > 0 {
			line += fmt.Sprintf(", %s %d", extra.name, extra.n)
		}
	}
	if len(res.QueuesNotFound) > 0 {
		names := make([]string, len(res.QueuesNotFound))
		for i, q := range res.QueuesNotFound {
			names[i] = q
			if near := res.QueueSuggestions[q]; near != "" {
				names[i] += fmt.Sprintf(" (did you mean %q?)", near)
			}
		}
		line += fmt.Sprintf(", queues not known to asynq %s (treated as empty: a typo, or the wrong Redis database?)",
			strings.Join(names, " "))
	}
	if len(res.UncoveredQueues) > 0 {
		var pairs []string
		for _, q := range slices.Sorted(maps.Keys(res.UncoveredQueues)) {
			pairs = append(pairs, fmt.Sprintf("%s %d", q, res.UncoveredQueues[q]))
		}
		line += fmt.Sprintf(", uncovered_queues %s (stalled PROCESSING jobs in queues that no live leader lease's queue set "+
			"nor this run covers: no daemon scans them; see the log)", strings.Join(pairs, " "))
	}
	if res.BadQueueNames > 0 {
		line += fmt.Sprintf(", bad_queue_names %d (skipped: no PostgreSQL text or metric label can hold them; see the log)", res.BadQueueNames)
	}
	if res.MarkersHeld > 0 {
		line += fmt.Sprintf(", markers_held %d (not written: no live asynq server serves a queue of this pass in Redis %s; "+
			"the wrong --redis-url?)", res.MarkersHeld, cmp.Or(redis, "the Redis read"))
	}
	for _, h := range res.StallStormHolds {
		what := fmt.Sprintf("stall-storm hold %d", h.ID)
		if h.Started {
			what = fmt.Sprintf("stall-storm hold %d started", h.ID)
			if h.ID == 0 {
				what = "stall-storm hold (a real pass would start it)"
			}
		}
		line += fmt.Sprintf(", %s on queues %s until %s: %d stalled job(s) held (release it with jobreaper release-hold)",
			what, strings.Join(h.Queues, ","), h.Until.UTC().Format(time.RFC3339), h.Held)
	}
	if res.LostLimitTripped {
		line += ", lost_limit_tripped (no lost_task reaped: more than max_lost_per_pass; see the log)"
	}
	if res.Interrupted {
		line += ", interrupted (a signal stopped the pass before its end: run it again)"
	}
	if res.Panicked {
		line += ", panicked (the pass ended at a panic, logged with its stack on stderr: report it, and run the pass again)"
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
	ready := startReadiness(readyCtx, d.pool, d.rdb, cfg.OpTimeout, log, mode.metrics)
	defer ready.stop()
	defer stopReady()
	srv, err := startMetricsServer(ctx, cfg.MetricsAddr, reg, ready, log)
	if err != nil {
		return err
	}
	page, err := a.startStatusPage(ctx, cfg, d, mode, log)
	if err != nil {
		srv.stop(ctx, mainLog)
		return err
	}
	if err := d.reaper.Start(ctx); err != nil {
		page.stop(ctx, mainLog)
		srv.stop(ctx, mainLog)
		return cannotRun("starting the reaper: %v", err)
	}
	mainLog.Info("jobreaper started", "schema", cfg.Schema, "queues", queuesAttr(cfg.Queues),
		"interval", cfg.Interval, "stall_timeout", cfg.StallTimeout, "min_stall_timeout", cfg.MinStallTimeout(),
		"metrics_addr", cfg.MetricsAddr, "status_addr", cfg.StatusAddr, "leader_lease", mode.leaderLease, "cancel_on_reap", mode.cancelOnReap)

	var failure error
	select {
	case <-ctx.Done():
		mainLog.Info("stopping on signal")
	case err := <-srv.failed:
		failure = cannotRun("the metrics server on %s stopped: %v; the daemon stops with it so that it is restarted", cfg.MetricsAddr, err)
	case err := <-page.failed:
		failure = cannotRun("the status page server on %s stopped: %v; the daemon stops with it so that it is restarted", cfg.StatusAddr, err)
	case err := <-d.reaper.Fatal():
		failure = giveUp(ctx, err, ready, srv, mainLog)
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
	//    that a scrape during shutdown still answers; the status page with
	//    it.
	page.stop(ctx, mainLog)
	srv.stop(ctx, mainLog)
	// 3. The Redis client and the PostgreSQL pool (deferred d.close), which
	//    nothing uses any more.
	if failure == nil {
		mainLog.Info("jobreaper stopped")
	}
	return failure
}

// fatalExitGrace is how long a daemon that gave up keeps answering 503 on
// /readyz and /healthz, with the reason, before it exits: long enough for
// an operator's probe in a loop or a load balancer to see why, short
// enough not to delay the restart noticeably. A signal ends it at once.
const fatalExitGrace = 5 * time.Second

// giveUp handles the reaper's fatal condition (err, from Fatal: its loop
// has ended and its leader lease is released): /readyz and /healthz
// answer 503 saying why for fatalExitGrace (skipped without a metrics
// server), then the daemon stops with exit code 3, so that its supervisor
// restarts it.
func giveUp(ctx context.Context, err error, ready *readiness, srv *metricsServer, log *slog.Logger) error {
	why := fmt.Sprintf("%v; the daemon runs no more passes, has given its leader lease up if it held one, "+
		"and is stopping (exit code %d) so that it is restarted", err, exitPanicked)
	ready.fail(why)
	log.Error("giving up: "+why+"; see the stacks logged above", "exit_in", fatalExitGrace.String())
	if srv != nil && srv.srv != nil {
		select {
		case <-ctx.Done():
		case <-time.After(fatalExitGrace):
		}
	}
	return &exitError{code: exitPanicked, err: errors.New(why)}
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
		return asynqstate.NewInspectorLister(asynq.NewInspectorFromRedisClient(rdb), asynqstate.WithPageSize(cfg.PageSize))
	}
	return asynqstate.NewIDLister(rdb, asynqstate.WithPageSize(cfg.PageSize))
}
