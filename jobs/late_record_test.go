package jobs_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
)

// A late CompleteWith on a pool with a single connection: the completion's
// transaction holds that connection when the refusal is found. Its
// late_result_rejected event is recorded after the rollback, on the freed
// connection, instead of waiting out the operation timeout for a second
// one and losing the event.
func TestLateCompleteWithOnAFullPoolRecordsItsEvent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := jobstest.New(t)
	baselineTypes(t, db)
	cfg, err := pgxpool.ParseConfig(db.URL)
	requireNoErr(t, err)
	cfg.MaxConns = 1
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	requireNoErr(t, err)
	t.Cleanup(pool.Close)
	// An operation timeout far above the test's own: a wait for a second
	// connection would show as an error naming the event, not as a slow
	// test.
	store := jobs.NewStore(pool, jobs.WithSchema(db.Schema), jobs.WithOpTimeout(20*time.Second))
	lease := queued(t, db, store, jobstest.Job{ID: "full", Type: "report.export"}, "w1")
	db.Exec(t, `UPDATE `+db.Table("jobs")+` SET status = 'FAILED', failure_reason = 'stalled', finished_at = now() WHERE id = 'full'`)

	wrote := false
	_, err = store.CompleteWith(ctx, nil, lease, func(pgx.Tx) error { wrote = true; return nil })
	if !errors.Is(err, jobs.ErrJobTerminal) || strings.Contains(err.Error(), "recording the") {
		t.Fatalf("late CompleteWith: err = %v, want ErrJobTerminal with its event recorded", err)
	}
	if wrote {
		t.Fatal("the completion function ran for a late attempt")
	}
	late := db.LateResults(t, "full")
	if len(late) != 1 || late[0].Operation != "Complete" || late[0].StaleGeneration != 1 || late[0].CurrentStatus != jobs.StatusFailed {
		t.Fatalf("late_result_rejected events = %+v, want one of Complete at generation 1 over FAILED", late)
	}
	if st := pool.Stat(); st.AcquiredConns() != 0 {
		t.Fatalf("%d connection(s) still acquired after CompleteWith returned", st.AcquiredConns())
	}

	// AfterCompleted owns its transaction the same way.
	err = store.AfterCompleted(ctx, nil, lease, func(pgx.Tx) error { wrote = true; return nil })
	if !errors.Is(err, jobs.ErrJobTerminal) || strings.Contains(err.Error(), "recording the") || wrote {
		t.Fatalf("late AfterCompleted: err = %v (fn ran: %t), want ErrJobTerminal with its event recorded", err, wrote)
	}
	if late := db.LateResults(t, "full"); len(late) != 2 || late[1].Operation != "CheckCompleted" {
		t.Fatalf("late_result_rejected events = %+v, want a second one of CheckCompleted", late)
	}
}

// A CompleteWith whose context was cancelled before it ran (cancel-on-reap
// cancels the handler's context) is still recorded as a late completion
// when the job was reaped, so the clean-up query of the worker docs finds
// the attempt; one whose attempt still owns the job writes no event.
func TestCompleteWithOnACancelledContextRecordsALateAttempt(t *testing.T) {
	t.Parallel()
	db, store := setup(t, nil)
	lease := queued(t, db, store, jobstest.Job{ID: "gone", Type: "report.export"}, "w1")
	db.Exec(t, `UPDATE `+db.Table("jobs")+` SET status = 'FAILED', failure_reason = 'stalled', finished_at = now() WHERE id = 'gone'`)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := store.CompleteWith(ctx, nil, lease, func(pgx.Tx) error { return nil })
	if !errors.Is(err, jobs.ErrJobTerminal) || !errors.Is(err, context.Canceled) && !strings.Contains(err.Error(), "context canceled") {
		t.Fatalf("CompleteWith on a cancelled context of a reaped job: err = %v, want ErrJobTerminal", err)
	}
	if late := db.LateResults(t, "gone"); len(late) != 1 || late[0].Operation != "Complete" || late[0].CurrentFailureReason != "stalled" {
		t.Fatalf("late_result_rejected events = %+v, want one of Complete over the stalled reap", late)
	}

	live := queued(t, db, store, jobstest.Job{ID: "live", Type: "report.export"}, "w1")
	_, err = store.CompleteWith(ctx, nil, live, func(pgx.Tx) error { return nil })
	if err == nil || errors.Is(err, jobs.ErrJobTerminal) || errors.Is(err, jobs.ErrStaleWorker) {
		t.Fatalf("CompleteWith on a cancelled context of a live job: err = %v, want the context's error", err)
	}
	if late := db.LateResults(t, "live"); len(late) != 0 {
		t.Fatalf("late_result_rejected events of a live job = %+v, want none", late)
	}
	requireRow(t, db, "live", jobs.StatusProcessing, 1, 0)
}
