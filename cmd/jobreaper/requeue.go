package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/jobreaper/jobreaper/config"
	"github.com/jobreaper/jobreaper/internal/asynqstate"
	"github.com/jobreaper/jobreaper/internal/idcheck"
	"github.com/jobreaper/jobreaper/internal/pgstore"
	"github.com/jobreaper/jobreaper/jobs"
)

// requeueLine is one line of requeue's output, one per job.
type requeueLine struct {
	JobID string `json:"job_id"`
	// Outcome is requeued, refused (nothing changed) or error (see
	// Message for what was done).
	Outcome    string `json:"outcome"`
	Queue      string `json:"queue,omitempty"`
	FromStatus string `json:"from_status,omitempty"`
	// TaskState is where asynq held the task (archived, completed, retry,
	// ..., not_found); on a refusal, what the lookup found.
	TaskState string `json:"task_state,omitempty"`
	// Generation is the job's new generation, or on a refusal the one it
	// was found at; absent when there is no row.
	Generation *int64 `json:"generation,omitempty"`
	// Message says what was done or why not, in every outcome (the text
	// line's words after the job ID).
	Message string `json:"message"`
}

// Outcomes of one job in requeue's output.
const (
	outcomeRequeued = "requeued"
	outcomeRefused  = "refused"
	outcomeError    = "error"
)

// staleLookupPage is how many stale QUEUED rows requeue --stale reads and
// looks up in asynq at a time (one pipeline).
const staleLookupPage = asynqstate.StatusChunk

func (a *app) requeueCmd() *cobra.Command {
	var (
		reason, output        string
		stale, replaceWaiting bool
		staleAfter            time.Duration
		failedSince           string
		failedUntil           string
		failures              []string
		bulk                  bulkFlags
	)
	cmd := &cobra.Command{
		Use: "requeue --reason TEXT [--replace-waiting] (JOB_ID... | --stale [--queues Q,...] [--stale-after D] |\n" +
			"  --failed-since TIME [--failed-until TIME] [--where-type T,...] [--queues Q,...] [--where-failure F,...] --limit N [--dry-run])",
		Short: "Run FAILED or stale QUEUED jobs again from the task asynq still holds for them",
		Long: `requeue puts each job back to QUEUED with its generation raised (so its
reaped marker no longer refuses it) and enqueues its task again with the
same task ID, type and payload, taken from the task asynq still holds
(archived or completed), which is deleted first. The new task has no
deadline, whatever the old one had, and Timeout = the type's hard_timeout.
Each requeue is recorded as a "requeued" event carrying --reason, and the
type's on_requeued cascade (from --config) runs in the same transaction:
that is where the product resets its own status of the job.

--stale takes the QUEUED jobs older than --stale-after (default: the
stale_queued_after setting) in --queues (default: every queue) whose task
asynq will never run: archived, completed or gone.

--failed-since takes the FAILED jobs that failed since TIME (and before
--failed-until, when given), of --where-type, --queues and --where-failure
(failure reasons: stalled, lost_task, cancelled, ...) when given: the
clean-up after an upstream outage. TIME is an RFC 3339 time or a duration
ago (2h, 90m), on the database's clock. --limit N (1 to 10000) is required:
a run takes at most N jobs, those that failed first, and says when more
match. --dry-run prints how many jobs match and the first 20 IDs, and
changes nothing. Each job taken goes through the same checks and writes as
requeue JOB_ID.

A job is refused, and nothing about it changes, when it is unknown,
PROCESSING or COMPLETED, when asynq holds its task active, pending,
scheduled or in retry, and when asynq holds no task for it at all (there
is no payload to send: the product must enqueue it again). A FAILED job
whose task waits in pending, scheduled or retry (a reaped job whose
cancel made asynq schedule a retry) is refused with the time of that
delivery: the start guard refuses it and asynq archives the task, after
which requeue works; --replace-waiting deletes the waiting task and
requeues the job at once instead. Running the command twice is safe: the
second run refuses the jobs the first requeued (their tasks are pending).

It prints one line per job on stdout, requeued, refused or error alike (one
JSON object per line with --output json: job_id, outcome, queue,
from_status, task_state, generation, message); logs go to stderr. It exits
0 when every job was requeued, 1 when any was refused or failed, 2 when it
could not run.`,
		RunE: func(cmd *cobra.Command, ids []string) error {
			if output != outputText && output != outputJSON {
				return cannotRun("--output %q is not a format: use text or json", output)
			}
			if strings.TrimSpace(reason) == "" {
				return cannotRun("--reason is required: say why the jobs are run again (it is recorded in each job's requeued event)")
			}
			filtered := cmd.Flags().Changed("failed-since") || cmd.Flags().Changed("failed-until") ||
				cmd.Flags().Changed("where-failure") || bulk.changed(cmd)
			var filter *pgstore.JobFilter
			if filtered {
				f, err := requeueFilter(cmd, failedSince, failedUntil, failures, &bulk, stale, ids)
				if err != nil {
					return err
				}
				filter = f
			}
			switch {
			case filtered:
			case stale && len(ids) > 0:
				return cannotRun("give job IDs or --stale, not both")
			case !stale && len(ids) == 0:
				return cannotRun("give the IDs of the jobs to requeue, or --stale for the stale QUEUED jobs, or --failed-since TIME with --limit N for the FAILED jobs of a time range")
			case !stale && cmd.Flags().Changed("stale-after"):
				return cannotRun("--stale-after applies to --stale only")
			case !stale && cmd.Flags().Changed("queues"):
				return cannotRun("--queues applies to --stale and --failed-since only: a job given by ID is requeued in its own queue")
			}
			cfg, err := a.loadConfig(cmd, config.RequeueKeys...)
			if err != nil {
				return err
			}
			if !cmd.Flags().Changed("stale-after") {
				staleAfter = cfg.StaleQueuedAfter
			} else if staleAfter <= 0 {
				return cannotRun("--stale-after %s must be positive", staleAfter)
			}
			if filter != nil {
				filter.Queues = cfg.Queues
			}
			return a.requeue(cmd.Context(), cfg, newLogger(cfg, a.stderr).With("component", "requeue"), requeueRun{
				ids: ids, stale: stale, staleAfter: staleAfter, reason: reason, output: output, replaceWaiting: replaceWaiting,
				filter: filter, dryRun: bulk.dryRun,
			})
		},
	}
	config.RegisterFlags(cmd.Flags(), config.RequeueKeys...)
	// The shared text speaks of the daemon's passes; requeue looks once.
	cmd.Flags().Lookup("queues").Usage = "with --stale or --failed-since: the queues whose jobs are requeued, comma-separated; empty: every queue"
	cmd.Flags().StringVar(&reason, "reason", "", "why the jobs are run again, recorded in each job's requeued event (required)")
	cmd.Flags().BoolVar(&stale, "stale", false, "requeue the stale QUEUED jobs: older than --stale-after, whose task asynq will never run")
	cmd.Flags().DurationVar(&staleAfter, "stale-after", config.StaleQueuedAfterDefault, "with --stale: how long a job must have been QUEUED; when not given, the stale_queued_after setting, whose own default is this")
	cmd.Flags().BoolVar(&replaceWaiting, "replace-waiting", false,
		"requeue a FAILED job whose task waits in pending, scheduled or retry by deleting that task, instead of refusing it until asynq archives it")
	cmd.Flags().StringVar(&failedSince, "failed-since", "", "requeue the FAILED jobs that failed since this RFC 3339 time or duration ago (2h)")
	cmd.Flags().StringVar(&failedUntil, "failed-until", "", "with --failed-since: only jobs that failed before this RFC 3339 time or duration ago")
	cmd.Flags().StringSliceVar(&failures, "where-failure", nil, "with --failed-since: only jobs of these failure reasons (stalled, lost_task, ...), comma-separated")
	bulk.register(cmd, "requeue")
	cmd.Flags().StringVar(&output, "output", outputText, "format of the lines on stdout: text or json (one object per line)")
	return cmd
}

// requeueFilter checks the flags of requeue's filtered form and returns
// its filter (without the queues, which come from the configuration).
func requeueFilter(cmd *cobra.Command, since, until string, failures []string, bulk *bulkFlags, stale bool, ids []string) (*pgstore.JobFilter, error) {
	switch {
	case stale || len(ids) > 0:
		return nil, cannotRun("give job IDs, --stale or --failed-since, only one of them")
	case since == "":
		return nil, cannotRun("--failed-since TIME is required to requeue by filter: there is no unscoped bulk requeue")
	case cmd.Flags().Changed("stale-after"):
		return nil, cannotRun("--stale-after applies to --stale only")
	}
	if err := bulk.check(cmd); err != nil {
		return nil, err
	}
	if err := checkList("--where-failure", failures); err != nil {
		return nil, err
	}
	f := &pgstore.JobFilter{Types: bulk.types, Failures: failures, Statuses: []string{pgstore.StatusFailed}, Limit: bulk.limit}
	var err error
	if f.FailedSince, err = parseTimeBound("--failed-since", since); err != nil {
		return nil, err
	}
	if until != "" {
		if f.FailedUntil, err = parseTimeBound("--failed-until", until); err != nil {
			return nil, err
		}
	}
	return f, nil
}

// requeueRun is one invocation of requeue.
type requeueRun struct {
	ids        []string
	stale      bool
	staleAfter time.Duration
	reason     string
	output     string
	// replaceWaiting: asynqstate.WithReplaceWaiting.
	replaceWaiting bool
	// filter, when set, selects the jobs (--failed-since); dryRun
	// prints what it selects and requeues none.
	filter *pgstore.JobFilter
	dryRun bool
}

// requeue connects, requeues the jobs and prints a line for each. It
// returns an exit-1 error when any job was refused or failed.
func (a *app) requeue(ctx context.Context, cfg config.Config, log *slog.Logger, run requeueRun) error {
	// The Store runs the on_requeued cascades, checked at start.
	d, err := connectOps(ctx, cfg, log, true, true)
	if err != nil {
		return err
	}
	defer d.close()
	store, rdb := d.store, d.rdb
	rq := asynqstate.NewRequeuer(rdb, store, asynqstate.WithReplaceWaiting(run.replaceWaiting))
	bad := 0
	one := func(id string) error {
		line := requeueLine{JobID: id}
		if err := jobs.CheckID(id); err != nil {
			bad++
			line.Outcome, line.Message = outcomeRefused, strings.TrimSuffix(err.Error(), ": "+jobs.ErrBadID.Error())
			return printRequeueLine(a, line, run.output)
		}
		done, err := rq.Requeue(ctx, id, run.reason)
		line.Queue, line.FromStatus, line.TaskState = done.Queue, done.FromStatus, done.TaskState
		if done.FromStatus != "" {
			line.Generation = &done.Generation
		}
		switch {
		case errors.Is(err, asynqstate.ErrRequeueRefused):
			bad++
			line.Outcome = outcomeRefused
			line.Message = strings.TrimPrefix(err.Error(), "job "+id+": "+asynqstate.ErrRequeueRefused.Error()+": ")
		case err != nil:
			bad++
			line.Outcome, line.Message = outcomeError, err.Error()
		default:
			line.Outcome = outcomeRequeued
			line.Message = fmt.Sprintf("%s -> QUEUED at generation %d; its %s task in queue %q was replaced by a new one",
				line.FromStatus, *line.Generation, line.TaskState, line.Queue)
			log.Info("job requeued", "job_id", id, "queue", done.Queue, "from_status", done.FromStatus,
				"task_state", done.TaskState, "generation", done.Generation, "replaced_waiting", done.ReplacedWaiting, "reason", run.reason)
		}
		return printRequeueLine(a, line, run.output)
	}
	switch {
	case run.filter != nil:
		sel, err := store.SelectJobs(ctx, *run.filter)
		if err != nil {
			return &exitError{code: exitPassErrors, err: fmt.Errorf("selecting the FAILED jobs to requeue failed, nothing changed: %w", err)}
		}
		if run.dryRun {
			if err := printBulkDryRun(a, "requeue", sel, run.filter.Limit, run.output); err != nil {
				return cannotRun("writing the output: %v", err)
			}
			return nil
		}
		if sel.Matched > len(sel.IDs) {
			log.Warn("more FAILED jobs match than --limit takes; run the command again for the rest", "matched", sel.Matched, "limit", run.filter.Limit)
		}
		if sel.Matched == 0 {
			log.Info("no FAILED job matches the filter")
		}
		for _, id := range sel.IDs {
			if err := one(id); err != nil {
				return cannotRun("writing the output: %v", err)
			}
		}
	case !run.stale:
		for _, id := range run.ids {
			if err := one(id); err != nil {
				return cannotRun("writing the output: %v", err)
			}
		}
	default:
		found, err := eachStaleQueued(ctx, store, asynqstate.NewStatusReader(rdb, cfg.OpTimeout), cfg.Queues, run.staleAfter, one)
		if err != nil {
			return &exitError{code: exitPassErrors, err: fmt.Errorf("looking for stale QUEUED jobs failed after %d job(s): %w", found, err)}
		}
		if found == 0 {
			log.Info("no stale QUEUED job: none is older than --stale-after with a task asynq will never run", "stale_after", run.staleAfter)
		}
	}
	if bad > 0 {
		return &exitError{code: exitPassErrors, err: fmt.Errorf("%d job(s) not requeued; see the lines above", bad)}
	}
	return nil
}

// eachStaleQueued calls fn for each QUEUED job of queues older than
// older whose task asynq will never run (archived, completed, gone, or
// its queue unknown), reading the rows page by page and looking each
// page's tasks up in one pipeline. It returns how many jobs it passed to
// fn.
func eachStaleQueued(ctx context.Context, store *pgstore.Store, statuses *asynqstate.StatusReader, queues []string,
	older time.Duration, fn func(id string) error) (int, error) {
	found := 0
	var after pgstore.StaleCursor
	for {
		page, err := store.ListStaleQueued(ctx, pgstore.StaleQueuedParams{Older: older, Queues: queues, After: after, Limit: staleLookupPage})
		if err != nil {
			return found, err
		}
		refs := make([]asynqstate.TaskRef, len(page))
		for i, row := range page {
			refs[i] = asynqstate.TaskRef{Queue: row.Queue, ID: row.ID}
		}
		sts, err := statuses.TaskStatuses(ctx, refs)
		if err != nil {
			return found, err
		}
		for i, row := range page {
			if sts[i].WillRun() && sts[i] != asynqstate.TaskQueueNotFound {
				continue // pending, scheduled, retry, active: asynq will run it
			}
			found++
			if err := fn(row.ID); err != nil {
				return found, err
			}
		}
		if len(page) < staleLookupPage {
			return found, nil
		}
		last := page[len(page)-1]
		after = pgstore.StaleCursor{UpdatedAt: last.UpdatedAt, ID: last.ID}
	}
}

func printRequeueLine(a *app, line requeueLine, output string) error {
	if output == outputJSON {
		return json.NewEncoder(a.stdout).Encode(line)
	}
	var err error
	id := idcheck.QuoteID(line.JobID)
	switch line.Outcome {
	case outcomeRequeued:
		_, err = fmt.Fprintf(a.stdout, "requeued %s: %s\n", id, line.Message)
	case outcomeRefused:
		_, err = fmt.Fprintf(a.stdout, "refused %s: %s; nothing changed\n", id, line.Message)
	default:
		_, err = fmt.Fprintf(a.stdout, "error %s: %s\n", id, oneLine(strings.ToValidUTF8(line.Message, "\ufffd")))
	}
	return err
}
