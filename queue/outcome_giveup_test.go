package queue

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"

	"github.com/hibiken/asynq"

	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
)

// TestOutcomeMappingWhenTheOutcomeCannotBeWritten: the worker's
// connection to PostgreSQL is cut while the handler runs and stays cut
// past the finalization retries (7.75 s of backoff). The guard gives up,
// counts settle_failed, logs what becomes of the job, and returns what
// keeps asynq's decision: a result asynq would retry stays retryable (the
// next claim takes the job over), a final one stays final (the job is left
// PROCESSING for the reaper).
func TestOutcomeMappingWhenTheOutcomeCannotBeWritten(t *testing.T) {
	t.Parallel()
	boom := errors.New("model API: 503")
	for _, tc := range []struct {
		name           string
		auto           bool
		retried, max   int
		result         error
		wantRetryable  bool
		wantLogMention string
	}{
		{"RetryableErrorStaysRetryable", false, 0, 3, boom, true, "next claim takes the job over"},
		{"LastAttemptErrorIsLeftToTheReaper", false, 3, 3, boom, false, "lost_task"},
		{"NonRetryableErrorIsLeftToTheReaper", false, 0, 3, Failure("source_missing", errors.Join(boom, asynq.SkipRetry)), false, "lost_task"},
		{"SuccessOfAnAutoCompleteTypeIsRetried", true, 0, 3, nil, true, "next claim takes the job over"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setupGuard(t)
			b.db.Exec(t, `UPDATE job_types SET auto_complete = $1 WHERE name = 'report.export'`, tc.auto)
			b.db.Insert(t, jobstest.Job{ID: "J1", Type: "report.export", Status: jobs.StatusQueued})
			cut := b.db.Cuttable(t)
			var logs jobstest.SyncBuffer
			g := NewGuard(jobs.NewStore(cut.Pool, jobs.WithSchema(b.db.Schema)), b.markers, WithWorker("W1"),
				WithLogger(slog.New(slog.NewTextHandler(io.MultiWriter(&logs, tWriter{t}), nil))), WithRegisterer(b.reg))
			g.taskID = testTaskID
			err := deliver(t.Context(), attempt(g, tc.retried, tc.max), "J1", handlerFunc(func(context.Context) error {
				cut.Cut() // stays cut past the retries
				return tc.result
			}))
			if err == nil || errors.Is(err, asynq.SkipRetry) == tc.wantRetryable {
				t.Fatalf("guard returned %v; want an error asynq retries: %v", err, tc.wantRetryable)
			}
			if tc.result != nil && !errors.Is(err, boom) {
				t.Fatalf("guard returned %v, want the handler's error", err)
			}
			cut.Restore()
			requireRow(t, b.db, "J1", jobs.StatusProcessing, 1)
			if v := b.decisions("settle_failed"); v != 1 {
				t.Fatalf("settle_failed = %v, want 1", v)
			}
			if n := cut.Refused(); n < 6 {
				t.Fatalf("%d connections refused, want the six tries of the outcome write at least", n)
			}
			line := ""
			for _, l := range strings.Split(logs.String(), "\n") {
				if strings.Contains(l, "reason=settle_failed") {
					line = l
				}
			}
			if !strings.Contains(line, "level=ERROR") || !strings.Contains(line, tc.wantLogMention) || !strings.Contains(line, "gave up after 6 tries") {
				t.Fatalf("settle_failed log line %q, want an ERROR saying %q and the tries", line, tc.wantLogMention)
			}
		})
	}
}
