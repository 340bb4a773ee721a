package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"

	"github.com/spf13/cobra"

	"github.com/jobreaper/jobreaper/config"
	"github.com/jobreaper/jobreaper/internal/asynqstate"
	"github.com/jobreaper/jobreaper/internal/idcheck"
	"github.com/jobreaper/jobreaper/internal/pgstore"
	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/queue"
)

// cancelLine is one line of cancel's output, one per job.
type cancelLine struct {
	JobID string `json:"job_id"`
	// Outcome is cancelled, refused (nothing changed) or error (nothing
	// changed; Message says why).
	Outcome string `json:"outcome"`
	Queue   string `json:"queue,omitempty"`
	// FromStatus is the status the job was cancelled from (QUEUED or
	// PROCESSING), or the one that refused the cancel.
	FromStatus string `json:"from_status,omitempty"`
	// TaskState is where asynq holds the job's task (active, pending, ...,
	// not_found), "" when it could not be looked up.
	TaskState  string `json:"task_state,omitempty"`
	Generation *int64 `json:"generation,omitempty"`
	// Marker is set or not_written (cancelled jobs only).
	Marker string `json:"marker,omitempty"`
	// Handler is cancel_sent, no_running_handler or cancel_not_sent
	// (cancelled jobs only).
	Handler string `json:"handler,omitempty"`
	Message string `json:"message,omitempty"`
}

// Outcomes and follow-ups of one job in cancel's output.
const (
	outcomeCancelled = "cancelled"

	markerSet        = "set"
	markerNotWritten = "not_written"

	handlerCancelSent    = "cancel_sent"
	handlerNone          = "no_running_handler"
	handlerCancelNotSent = "cancel_not_sent"
)

func (a *app) cancelCmd() *cobra.Command {
	var (
		reason, output              string
		createdSince, startedBefore string
		bulk                        bulkFlags
	)
	cmd := &cobra.Command{
		Use: "cancel --reason TEXT (<job-id>... | [--created-since TIME] [--started-before TIME]\n" +
			"  [--where-type T,...] [--queues Q,...] --limit N [--dry-run])",
		Short: "Fail QUEUED or PROCESSING jobs as cancelled, with their cascade, marker and a cancel of the running handler",
		Long: `cancel fails each named job that is QUEUED or PROCESSING with failure code
cancelled, in one fenced transaction per job that also runs the type's
on_failed cascade (from --config) and records a "cancelled" event carrying
--reason. Then it sets the job's marker (so the start guard refuses its task;
a marker that cannot be written is re-set by the daemon's marker repair) and,
when asynq holds the job's task active, publishes asynq's cancel of its
running handler; a task that is not active has no running handler, and the
line says so. Every later write of the cancelled attempt (Complete, Advance,
Heartbeat, Fail) is refused as job_terminal.

A COMPLETED, FAILED or unknown job is refused and nothing about it changes.

Instead of IDs, a time filter takes the QUEUED and PROCESSING jobs created
since --created-since and/or (PROCESSING only) whose attempt started before
--started-before, of --where-type and --queues when given. TIME is an RFC
3339 time or a duration ago (2h, 90m), on the database's clock; at least
one time flag is required. --limit N (1 to 10000) is required: a run takes
at most N jobs, the oldest first, and says when more match. --dry-run prints
how many jobs match and the first 20 IDs, and changes nothing. Each job
taken goes through the same checks and writes as cancel JOB_ID.

It prints one line per job on stdout, cancelled, refused or error alike (one
JSON object per line with --output json: job_id, outcome, queue, from_status,
task_state, generation, marker, handler, message); logs go to stderr. Exit
codes: 0 every job was cancelled, 1 a job was refused or a follow-up
(marker, cancel) failed, 2 could not run.`,
		RunE: func(cmd *cobra.Command, ids []string) error {
			if output != outputText && output != outputJSON {
				return cannotRun("--output %q is not a format: use text or json", output)
			}
			if err := pgstore.CheckOperatorReason(reason); err != nil {
				return cannotRun("cancel needs --reason TEXT, recorded in each job's event: %v", strings.TrimSuffix(err.Error(), ": "+jobs.ErrInvalidArgument.Error()))
			}
			var filter *pgstore.JobFilter
			queues, err := cmd.Flags().GetStringSlice("queues")
			if err != nil {
				return cannotRun("--queues: %v", err)
			}
			if cmd.Flags().Changed("created-since") || cmd.Flags().Changed("started-before") || cmd.Flags().Changed("queues") || bulk.changed(cmd) {
				f, err := cancelFilter(cmd, createdSince, startedBefore, queues, &bulk, ids)
				if err != nil {
					return err
				}
				filter = f
			} else if len(ids) == 0 {
				return cannotRun("give the IDs of the jobs to cancel, or a time filter (--created-since, --started-before) with --limit")
			}
			d, cfg, log, err := a.openOps(cmd, config.CancelKeys, true, true)
			if err != nil {
				return err
			}
			defer d.close()
			return a.cancelJobs(cmd.Context(), d, log.With("component", "cancel"), cancelRun{ids: ids, reason: reason, output: output, cfg: cfg,
				filter: filter, dryRun: bulk.dryRun})
		},
	}
	config.RegisterFlags(cmd.Flags(), config.CancelKeys...)
	cmd.Flags().StringVar(&createdSince, "created-since", "", "cancel the QUEUED and PROCESSING jobs created since this RFC 3339 time or duration ago (2h)")
	cmd.Flags().StringVar(&startedBefore, "started-before", "", "cancel the PROCESSING jobs whose attempt started before this RFC 3339 time or duration ago (2h)")
	// --queues is the daemon's setting, hidden for cancel by RegisterFlags;
	// cancel reads the flag alone, so that a config file's queues never
	// scope a bulk cancel.
	qf := cmd.Flags().Lookup("queues")
	qf.Hidden, qf.Usage = false, "with a time filter: only jobs of these queues, comma-separated (a job without a queue is in default)"
	bulk.register(cmd, "cancel")
	cmd.Flags().StringVar(&reason, "reason", "", "why the jobs are cancelled (required; recorded in each job's event)")
	cmd.Flags().StringVar(&output, "output", outputText, "format of the lines on stdout: text or json (one object per line)")
	return cmd
}

// cancelFilter checks the flags of cancel's filtered form and returns its
// filter.
func cancelFilter(cmd *cobra.Command, createdSince, startedBefore string, queues []string, bulk *bulkFlags, ids []string) (*pgstore.JobFilter, error) {
	switch {
	case len(ids) > 0:
		return nil, cannotRun("give job IDs or a time filter, not both")
	case createdSince == "" && startedBefore == "":
		return nil, cannotRun("--created-since or --started-before is required to cancel by filter: there is no unscoped bulk cancel")
	}
	if err := bulk.check(cmd); err != nil {
		return nil, err
	}
	if err := checkList("--queues", queues); err != nil {
		return nil, err
	}
	f := &pgstore.JobFilter{Types: bulk.types, Queues: queues, Limit: bulk.limit,
		Statuses: []string{pgstore.StatusQueued, pgstore.StatusProcessing}}
	var err error
	if createdSince != "" {
		if f.CreatedSince, err = parseTimeBound("--created-since", createdSince); err != nil {
			return nil, err
		}
	}
	if startedBefore != "" {
		// A QUEUED job's started_at is a past attempt's: only a running
		// attempt is selected by its start.
		f.Statuses = []string{pgstore.StatusProcessing}
		if f.StartedBefore, err = parseTimeBound("--started-before", startedBefore); err != nil {
			return nil, err
		}
	}
	return f, nil
}

// cancelRun is one invocation of cancel.
type cancelRun struct {
	ids            []string
	reason, output string
	cfg            config.Config
	// filter, when set, selects the jobs instead of ids; dryRun prints
	// what it selects and cancels none.
	filter *pgstore.JobFilter
	dryRun bool
}

// cancelJobs cancels each job of run.ids and prints one line per job. It
// returns an exit-1 error when any job was refused or a follow-up failed.
func (a *app) cancelJobs(ctx context.Context, d *opsDeps, log *slog.Logger, run cancelRun) error {
	c := jobCanceller{d: d, log: log, reason: run.reason, operator: operatorName(),
		tasks: asynqstate.NewStatusReader(d.rdb, run.cfg.OpTimeout), canceller: asynqstate.NewCanceller(d.rdb, run.cfg.OpTimeout)}
	ids := run.ids
	if run.filter != nil {
		sel, err := d.store.SelectJobs(ctx, *run.filter)
		if err != nil {
			return &exitError{code: exitPassErrors, err: fmt.Errorf("selecting the jobs to cancel failed, nothing changed: %w", err)}
		}
		if run.dryRun {
			if err := printBulkDryRun(a, "cancel", sel, run.filter.Limit, run.output); err != nil {
				return cannotRun("writing the output: %v", err)
			}
			return nil
		}
		if sel.Matched > len(sel.IDs) {
			log.Warn("more jobs match than --limit takes; run the command again for the rest", "matched", sel.Matched, "limit", run.filter.Limit)
		}
		if sel.Matched == 0 {
			log.Info("no QUEUED or PROCESSING job matches the filter")
		}
		ids = sel.IDs
	}
	bad := 0
	for _, id := range ids {
		line := c.cancel(ctx, id)
		if line.Outcome != outcomeCancelled || line.Marker != markerSet || line.Handler == handlerCancelNotSent {
			bad++
		}
		if err := printCancelLine(a, line, run.output); err != nil {
			return cannotRun("writing the output: %v", err)
		}
	}
	if bad > 0 {
		return &exitError{code: exitPassErrors, err: fmt.Errorf("%d job(s) not cancelled, or cancelled without their marker or handler cancel; see the lines above", bad)}
	}
	return nil
}

// jobCanceller cancels one job after another.
type jobCanceller struct {
	d                *opsDeps
	log              *slog.Logger
	reason, operator string
	tasks            *asynqstate.StatusReader
	canceller        *asynqstate.Canceller
}

// cancel cancels job id and says what it did, or why it did nothing.
func (c jobCanceller) cancel(ctx context.Context, id string) cancelLine {
	line := cancelLine{JobID: id}
	res, err := c.d.store.Cancel(ctx, pgstore.CancelParams{JobID: id, Reason: c.reason, Operator: c.operator})
	switch {
	case errors.Is(err, jobs.ErrBadID):
		line.Outcome, line.Message = outcomeRefused, strings.TrimSuffix(strings.TrimPrefix(err.Error(), "jobs.Cancel: "), ": "+jobs.ErrBadID.Error())
		return line
	case errors.Is(err, jobs.ErrNotFound):
		line.Outcome, line.Message = outcomeRefused, "no job has this ID (check the ID and --schema)"
		return line
	case errors.Is(err, jobs.ErrJobTerminal):
		line.Outcome, line.FromStatus, line.Generation = outcomeRefused, res.PreviousStatus, &res.Generation
		line.Queue, line.TaskState = c.taskState(ctx, id, res.Queue)
		line.Message = fmt.Sprintf("it is %s; only a QUEUED or PROCESSING job can be cancelled", res.PreviousStatus)
		return line
	case err != nil:
		line.Outcome, line.Message = outcomeError, "cancelling failed, nothing changed: "+oneLine(err.Error())
		return line
	}
	line.Outcome, line.FromStatus, line.Generation = outcomeCancelled, res.PreviousStatus, &res.Generation
	c.log.Info("job cancelled", "job_id", id, "previous_status", res.PreviousStatus, "generation", res.Generation, "reason", c.reason)
	// The follow-ups run even when the command is being stopped: the job
	// is FAILED already, and its marker and handler cancel belong to it.
	fctx := context.WithoutCancel(ctx)
	line.Queue, line.TaskState = c.taskState(fctx, id, res.Queue)
	var notes []string
	// The marker makes the start guard refuse a delivery of the task;
	// the FAILED row refuses it too while the marker is missing.
	if _, err := c.d.writer.Set(fctx, id, res.Generation, queue.MarkerTTL); err != nil {
		line.Marker = markerNotWritten
		notes = append(notes, "marker NOT written ("+oneLine(err.Error())+"; the daemon's marker repair re-sets it, and the FAILED row refuses the task meanwhile)")
	} else {
		if err := c.d.store.MarkMarkerSet(fctx, id, res.Generation); err != nil {
			c.log.Warn("recording the marker failed; the daemon's marker repair writes it again", "job_id", id, "err", err)
		}
		line.Marker = markerSet
		notes = append(notes, "marker set")
	}
	// Only an active task has a handler to cancel. When asynq could not
	// be asked, the cancel is sent anyway: a server that does not run the
	// task ignores it.
	switch line.TaskState {
	case string(asynqstate.TaskNotFound), string(asynqstate.TaskQueueNotFound):
		line.Handler = handlerNone
		notes = append(notes, "no running handler to cancel (asynq holds no task for it)")
	case string(asynqstate.TaskActive), "":
		if _, err := c.canceller.Cancel(fctx, []string{id}); err != nil {
			line.Handler = handlerCancelNotSent
			notes = append(notes, "cancel of the running handler NOT sent ("+oneLine(err.Error())+")")
		} else {
			line.Handler = handlerCancelSent
			notes = append(notes, "cancel sent to its running handler")
		}
	default:
		line.Handler = handlerNone
		notes = append(notes, fmt.Sprintf("no running handler to cancel (asynq holds its task %s)", line.TaskState))
	}
	line.Message = strings.Join(notes, ", ")
	return line
}

// taskState returns the job's queue (asynq's default for a row without
// one) and where asynq holds its task, "" when that could not be read (a
// warning is logged).
func (c jobCanceller) taskState(ctx context.Context, id, rowQueue string) (string, string) {
	q := rowQueue
	if q == "" {
		q = queue.QueueDefault
	}
	sts, err := c.tasks.TaskStatuses(ctx, []asynqstate.TaskRef{{Queue: q, ID: id}})
	if err != nil {
		c.log.Warn("looking the job's task up in asynq failed; its line says nothing of the task", "job_id", id, "queue", q, "err", err)
		return q, ""
	}
	return q, string(sts[0])
}

func printCancelLine(a *app, line cancelLine, output string) error {
	if output == outputJSON {
		return json.NewEncoder(a.stdout).Encode(line)
	}
	id := idcheck.QuoteID(line.JobID)
	var err error
	switch line.Outcome {
	case outcomeCancelled:
		_, err = fmt.Fprintf(a.stdout, "cancelled job %s (was %s, generation %d): %s\n", id, line.FromStatus, *line.Generation, line.Message)
	case outcomeRefused:
		_, err = fmt.Fprintf(a.stdout, "refused job %s: %s; nothing changed\n", id, line.Message)
	default:
		_, err = fmt.Fprintf(a.stdout, "error for job %s: %s\n", id, line.Message)
	}
	return err
}
