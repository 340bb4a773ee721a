package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/hibiken/asynq"
	"github.com/spf13/cobra"

	"github.com/jobreaper/jobreaper/config"
	"github.com/jobreaper/jobreaper/internal/asynqstate"
	"github.com/jobreaper/jobreaper/internal/idcheck"
	"github.com/jobreaper/jobreaper/internal/pgcore"
	"github.com/jobreaper/jobreaper/internal/pgstore"
	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/queue"
)

// Inspect shows at most this many of a job's batch records and events,
// the most recent ones; the counts say how many there are in all.
const (
	inspectBatches = 5
	inspectEvents  = 50
)

// taskStateUnknown is the asynq task state of a job whose row names no
// queue: asynq cannot be asked without one.
const taskStateUnknown = "unknown"

// inspectDoc is the JSON form of `jobreaper inspect --output json`. Times
// are the database's; durations are seconds.
type inspectDoc struct {
	JobID           string     `json:"job_id"`
	Status          string     `json:"status"`
	Type            string     `json:"type"`
	Queue           string     `json:"queue"`
	FailureReason   string     `json:"failure_reason"`
	Generation      int64      `json:"generation"`
	FirstGeneration int64      `json:"first_generation"`
	Worker          string     `json:"worker"`
	ParentID        string     `json:"parent_id"`
	TenantID        string     `json:"tenant_id"`
	Limits          *limitsDoc `json:"limits"`
	// ReapCount is the retry reaps of the job's current life, ReapRetries
	// its type's budget (job_types.reap_retries; 0 without a job_types row).
	ReapCount   int       `json:"reap_count"`
	ReapRetries int       `json:"reap_retries"`
	DBNow       time.Time `json:"db_now"`
	CreatedAt   dbTime    `json:"created_at"`
	StartedAt   *dbTime   `json:"started_at"`
	UpdatedAt   dbTime    `json:"updated_at"`
	FinishedAt  *dbTime   `json:"finished_at"`
	// RuntimeSeconds and IdleSeconds are null when the timestamp they are
	// counted from is infinite; both stop at finished_at once the job is
	// COMPLETED or FAILED.
	RuntimeSeconds *float64              `json:"runtime_seconds"`
	IdleSeconds    *float64              `json:"idle_seconds"`
	Cursor         int64                 `json:"cursor"`
	Total          *int64                `json:"total"`
	Batches        batchesDoc            `json:"batches"`
	EventCount     int64                 `json:"event_count"`
	Events         []pgstore.EventRecord `json:"events"`
	MarkerSetAt    *dbTime               `json:"marker_set_at"`
	Marker         markerDoc             `json:"marker"`
	TaskState      string                `json:"task_state"`
	// TaskTimeoutSeconds and TaskDeadline are the asynq task's Timeout and
	// Deadline, as the producer enqueued it (asynq cancels a handler at the
	// earlier of the two); null when the task has none, or asynq does not
	// hold the task, or it could not be read.
	TaskTimeoutSeconds *float64   `json:"task_timeout_seconds"`
	TaskDeadline       *time.Time `json:"task_deadline"`
}

type limitsDoc struct {
	MaxRuntimeSeconds float64 `json:"max_runtime_seconds"`
	// StallTimeoutSeconds and HardTimeoutSeconds are the type's columns,
	// null when the type leaves them to the daemon's default and 24 h.
	StallTimeoutSeconds *float64 `json:"stall_timeout_seconds"`
	HardTimeoutSeconds  *float64 `json:"hard_timeout_seconds"`
	// EffectiveStallTimeoutSeconds and EffectiveHardTimeoutSeconds are
	// the limits as applied: the column, or the default of the
	// configuration inspect was run with (stall_timeout) and 24 h.
	EffectiveStallTimeoutSeconds float64 `json:"effective_stall_timeout_seconds"`
	EffectiveHardTimeoutSeconds  float64 `json:"effective_hard_timeout_seconds"`
	AutoComplete                 bool    `json:"auto_complete"`
	ReapRetries                  int     `json:"reap_retries"`
	// ReapRetryDelaySeconds is job_types.reap_retry_delay.
	ReapRetryDelaySeconds float64 `json:"reap_retry_delay_seconds"`
}

// dbTime is a database timestamp as inspect shows it: a time, or the
// 'infinity' or '-infinity' PostgreSQL holds (a JSON string either way).
type dbTime struct {
	time.Time
	// Inf is "infinity" or "-infinity" for an infinite timestamp, "" for
	// a time.
	Inf string
}

// MarshalJSON writes the time in RFC 3339, or the infinity's name.
func (t dbTime) MarshalJSON() ([]byte, error) {
	if t.Inf != "" {
		return json.Marshal(t.Inf)
	}
	return json.Marshal(t.Time)
}

// UnmarshalJSON reads what MarshalJSON writes.
func (t *dbTime) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err == nil && (s == "infinity" || s == "-infinity") {
		*t = dbTime{Inf: s}
		return nil
	}
	t.Inf = ""
	return json.Unmarshal(b, &t.Time)
}

// String is the RFC 3339 form in UTC, or the infinity's name.
func (t dbTime) String() string {
	if t.Inf != "" {
		return t.Inf
	}
	return t.UTC().Format(time.RFC3339)
}

// dbTimeOf is column's dbTime from the record: infinite when the row
// holds an infinity there, else at (nil when at is nil).
func dbTimeOf(rec pgstore.Record, column string, at *time.Time) *dbTime {
	if inf := rec.Infinite[column]; inf != "" {
		return &dbTime{Inf: inf}
	}
	if at == nil {
		return nil
	}
	return &dbTime{Time: *at}
}

type batchesDoc struct {
	Count int64                 `json:"count"`
	Last  []pgstore.BatchRecord `json:"last"`
}

type markerDoc struct {
	Present    bool     `json:"present"`
	Generation *int64   `json:"generation"`
	TTLSeconds *float64 `json:"ttl_seconds"`
	// Error says why the marker could not be read; "" when it was.
	Error string `json:"error,omitempty"`
}

func (a *app) inspectCmd() *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "inspect <job-id>",
		Short: "Print one job's whole story: row, limits, runtime, batches, events, marker and asynq task state, timeout and deadline",
		Long: `inspect prints a job's status, type, queue, limits, runtime and idle time on
the database clock, generation, worker, cursor and total, its recorded
batches (count and the last few), its event history (kind, time, generation,
detail), its marker (present, generation, TTL) and its asynq task state
(active, pending, scheduled, retry, archived, completed, not_found;
unknown when the row has no queue) with the task's timeout and deadline
(asynq cancels a handler at the earlier of the two). It changes nothing. When Redis cannot
be reached it still prints the row, with the marker and the task state
marked unreadable and a warning on stderr.

With --output json stdout is one JSON document: the job's, or
{"error":"<message>"} when there is none to print (the message is also on
stderr). An unknown job exits 1; a command that could not run exits 2.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if output != outputText && output != outputJSON {
				return cannotRun("--output %q is not a format: use text or json", output)
			}
			err := a.inspectJob(cmd, args[0], output)
			if err != nil && output == outputJSON {
				// One JSON document on stdout, as promised, whatever
				// stopped the command; the message is also on stderr.
				_ = json.NewEncoder(a.stdout).Encode(struct {
					Error string `json:"error"`
				}{oneLine(err.Error())})
			}
			return err
		},
	}
	config.RegisterFlags(cmd.Flags(), config.InspectKeys...)
	cmd.Flags().StringVar(&output, "output", outputText, "format on stdout: text or json")
	return cmd
}

// inspectJob loads the configuration, connects and prints job id's
// document in output's format.
func (a *app) inspectJob(cmd *cobra.Command, id, output string) error {
	d, cfg, log, err := a.openOps(cmd, config.InspectKeys, false, false)
	if err != nil {
		return err
	}
	defer func() { d.close() }()
	// The row is PostgreSQL's: an unreachable Redis costs only the marker
	// and the task state, which the document marks unreadable.
	redisErr := d.attachRedis(cmd.Context(), cfg, log)
	if down := (redisDownError{}); redisErr != nil && !errors.As(redisErr, &down) {
		return redisErr // a setting to fix, not an outage to work around
	}
	if redisErr != nil {
		log.Warn("Redis unreachable: the marker and the asynq task state are shown as unreadable",
			"component", "main", "err", oneLine(redisErr.Error()))
	}
	doc, err := a.inspect(cmd.Context(), d, cfg, id, redisErr)
	if err != nil {
		return err
	}
	if output == outputJSON {
		return json.NewEncoder(a.stdout).Encode(doc)
	}
	return printInspect(a.stdout, doc)
}

// inspect gathers job id's document from PostgreSQL, the marker store and
// asynq. A marker or task state that cannot be read is shown as such, and
// so are both when redisErr says Redis could not be reached (d has no
// Redis then); an unknown job is an exit-1 error.
func (a *app) inspect(ctx context.Context, d *opsDeps, cfg config.Config, id string, redisErr error) (inspectDoc, error) {
	rec, err := d.store.Inspect(ctx, id, inspectBatches, inspectEvents)
	switch {
	case errors.Is(err, jobs.ErrNotFound):
		return inspectDoc{}, &exitError{code: exitPassErrors, err: fmt.Errorf("job %s not found in schema %q (check the ID and --schema)", idcheck.QuoteID(id), cfg.Schema)}
	case errors.Is(err, jobs.ErrInvalidArgument) || errors.Is(err, jobs.ErrBadID):
		return inspectDoc{}, &exitError{code: exitPassErrors, err: fmt.Errorf("job %s is outside what jobreaper reads or acts on: %v", idcheck.QuoteID(id), err)}
	case err != nil:
		return inspectDoc{}, cannotRun("reading job %s: %s", idcheck.QuoteID(id), oneLine(err.Error()))
	}
	doc := inspectDoc{
		JobID: rec.ID, Status: rec.Status, Type: rec.Type, Queue: rec.Queue, FailureReason: rec.FailureReason,
		Generation: rec.Generation, FirstGeneration: rec.FirstGeneration, Worker: rec.Worker, ParentID: rec.ParentID,
		TenantID: rec.TenantID, DBNow: rec.DBNow, CreatedAt: *dbTimeOf(rec, "created_at", &rec.CreatedAt),
		StartedAt: dbTimeOf(rec, "started_at", rec.StartedAt), UpdatedAt: *dbTimeOf(rec, "updated_at", &rec.UpdatedAt),
		FinishedAt: dbTimeOf(rec, "finished_at", rec.FinishedAt), IdleSeconds: seconds(rec.Idle),
		Cursor: rec.Cursor, Total: rec.Total, Batches: batchesDoc{Count: rec.BatchCount, Last: rec.Batches},
		EventCount: rec.EventCount, Events: rec.Events, MarkerSetAt: dbTimeOf(rec, "marker_set_at", rec.MarkerSetAt),
	}
	if doc.Batches.Last == nil {
		doc.Batches.Last = []pgstore.BatchRecord{}
	}
	if doc.Events == nil {
		doc.Events = []pgstore.EventRecord{}
	}
	if rec.Runtime != nil {
		s := rec.Runtime.Seconds()
		doc.RuntimeSeconds = &s
	}
	budget := pgcore.BudgetOf(rec.Snapshot)
	doc.ReapCount, doc.ReapRetries = budget.Count, budget.Retries
	if l := rec.Limits; l != nil {
		doc.Limits = &limitsDoc{MaxRuntimeSeconds: l.MaxRuntime.Seconds(), StallTimeoutSeconds: seconds(l.StallTimeout),
			HardTimeoutSeconds: seconds(l.HardTimeout), AutoComplete: l.AutoComplete,
			EffectiveStallTimeoutSeconds: cmp.Or(l.StallTimeout, &cfg.StallTimeout).Seconds(),
			EffectiveHardTimeoutSeconds:  cmp.Or(l.HardTimeout, ptrDuration(jobs.HardTimeoutDefault)).Seconds(),
			ReapRetries:                  budget.Retries, ReapRetryDelaySeconds: budget.Delay.Seconds()}
	}
	if redisErr != nil {
		doc.Marker.Error = oneLine(redisErr.Error())
		doc.TaskState = taskStateUnknown
		if rec.Queue != "" {
			doc.TaskState = "error: " + oneLine(redisErr.Error())
		}
		return doc, nil
	}
	if gen, found, err := d.markers.Get(ctx, id); err != nil {
		doc.Marker.Error = oneLine(err.Error())
	} else if found {
		doc.Marker.Present, doc.Marker.Generation = true, &gen
		// PTTL: -1 means no expiry (a marker set by hand), -2 gone since.
		if ttl, err := d.rdb.PTTL(ctx, queue.MarkerKey(id)).Result(); err == nil && ttl > 0 {
			s := ttl.Seconds()
			doc.Marker.TTLSeconds = &s
		}
	}
	doc.TaskState = taskStateUnknown
	if rec.Queue != "" {
		lookup, err := d.taskLookup(cfg)
		if err != nil {
			return doc, err
		}
		st, err := lookup.TaskStatus(ctx, rec.Queue, id)
		switch {
		case err != nil:
			doc.TaskState = "error: " + oneLine(err.Error())
		case st == asynqstate.TaskQueueNotFound:
			doc.TaskState = string(asynqstate.TaskNotFound)
		default:
			doc.TaskState = string(st)
		}
		if err == nil && st != asynqstate.TaskNotFound && st != asynqstate.TaskQueueNotFound {
			taskLimits(d, rec.Queue, id, &doc)
		}
	}
	return doc, nil
}

// taskLimits reads the asynq task's Timeout and Deadline into doc. asynq
// keeps both in the task; a task that cannot be read now (gone since its
// state was read) leaves them null, and the state says the rest.
func taskLimits(d *opsDeps, queueName, id string, doc *inspectDoc) {
	info, err := asynq.NewInspectorFromRedisClient(d.rdb).GetTaskInfo(queueName, id)
	if err != nil {
		return
	}
	if info.Timeout > 0 {
		s := info.Timeout.Seconds()
		doc.TaskTimeoutSeconds = &s
	}
	if !info.Deadline.IsZero() {
		t := info.Deadline
		doc.TaskDeadline = &t
	}
}

func ptrDuration(d time.Duration) *time.Duration { return &d }

func seconds(d *time.Duration) *float64 {
	if d == nil {
		return nil
	}
	s := d.Seconds()
	return &s
}

// printInspect writes doc for people, one fact a line.
func printInspect(w io.Writer, doc inspectDoc) error {
	var b strings.Builder
	line := func(label, format string, args ...any) {
		fmt.Fprintf(&b, "%-15s %s\n", label+":", fmt.Sprintf(format, args...))
	}
	status := doc.Status
	if doc.FailureReason != "" {
		status += " (" + doc.FailureReason + ")"
	}
	line("job", "%s", idcheck.QuoteID(doc.JobID))
	line("status", "%s", status)
	line("type", "%s", doc.Type)
	line("queue", "%s", orNone(doc.Queue))
	if l := doc.Limits; l != nil {
		stall, hard := dur(&l.EffectiveStallTimeoutSeconds, ""), dur(&l.EffectiveHardTimeoutSeconds, "")
		if l.StallTimeoutSeconds == nil {
			stall += " (daemon default)"
		}
		if l.HardTimeoutSeconds == nil {
			hard += " (default)"
		}
		line("limits", "max_runtime %s, stall_timeout %s, hard_timeout %s, auto_complete %t",
			dur(&l.MaxRuntimeSeconds, ""), stall, hard, l.AutoComplete)
	} else {
		line("limits", "none: no job_types row for type %q (the reaper skips it as unknown_type)", doc.Type)
	}
	notStarted := "not started"
	if doc.StartedAt != nil && doc.StartedAt.Inf != "" {
		notStarted = "unknown: started_at is " + doc.StartedAt.Inf
	}
	frozen := ""
	if doc.FinishedAt != nil && (doc.Status == jobs.StatusCompleted || doc.Status == jobs.StatusFailed) {
		frozen = ", counted to finished_at"
	}
	line("runtime", "%s (database clock %s%s)", dur(doc.RuntimeSeconds, notStarted), doc.DBNow.UTC().Format(time.RFC3339), frozen)
	line("idle", "%s", dur(doc.IdleSeconds, "unknown: updated_at is "+doc.UpdatedAt.Inf))
	times := "created " + doc.CreatedAt.String()
	for _, t := range []struct {
		name string
		at   *dbTime
	}{{"started", doc.StartedAt}, {"updated", &doc.UpdatedAt}, {"finished", doc.FinishedAt}} {
		if t.at != nil {
			times += ", " + t.name + " " + t.at.String()
		}
	}
	line("times", "%s", times)
	line("generation", "%d (this life started at %d)", doc.Generation, doc.FirstGeneration)
	line("reap retries", "reap_count %d of reap_retries %d in this life", doc.ReapCount, doc.ReapRetries)
	line("worker", "%s", orNone(doc.Worker))
	total := "none"
	if doc.Total != nil {
		total = fmt.Sprint(*doc.Total)
	}
	line("progress", "cursor %d of total %s", doc.Cursor, total)
	line("batches", "%d recorded", doc.Batches.Count)
	for _, bt := range doc.Batches.Last {
		fmt.Fprintf(&b, "  %s  token %s  generation %d  cursor %d -> %d\n", bt.At.UTC().Format(time.RFC3339), bt.Token, bt.Generation, bt.ExpectedCursor, bt.CursorAfter)
	}
	line("events", "%d recorded", doc.EventCount)
	for _, ev := range doc.Events {
		gen := "-"
		if ev.Generation != nil {
			gen = fmt.Sprint(*ev.Generation)
		}
		fmt.Fprintf(&b, "  %s  %-20s generation %s  %s\n", ev.At.UTC().Format(time.RFC3339), ev.Kind, gen, string(ev.Detail))
	}
	switch m := doc.Marker; {
	case m.Error != "":
		line("marker", "unreadable: %s", m.Error)
	case m.Present:
		line("marker", "present, generation %d, expires in %s", *m.Generation, dur(m.TTLSeconds, "never"))
	default:
		line("marker", "absent")
	}
	task := doc.TaskState
	if doc.TaskTimeoutSeconds != nil || doc.TaskDeadline != nil {
		deadline := "no deadline"
		if doc.TaskDeadline != nil {
			deadline = "deadline " + doc.TaskDeadline.UTC().Format(time.RFC3339)
		}
		task += fmt.Sprintf(" (timeout %s, %s)", dur(doc.TaskTimeoutSeconds, "none"), deadline)
	}
	line("asynq task", "%s", task)
	_, err := io.WriteString(w, b.String())
	return err
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

// dur formats seconds as a Go duration rounded to the second, or none
// when nil.
func dur(s *float64, none string) string {
	if s == nil {
		return none
	}
	return time.Duration(*s * float64(time.Second)).Round(time.Second).String()
}
