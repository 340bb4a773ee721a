package reaper_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jobreaper/jobreaper/internal/asynqstate"
	"github.com/jobreaper/jobreaper/internal/pgstore"
	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
	"github.com/jobreaper/jobreaper/reaper"
)

// deadWorker is a default-named worker no live asynq server runs in.
const deadWorker = "pod-7f9c:4242"

// deadAttempt is asynq's side of the rule when every condition holds.
func deadAttempt() reaper.DeadAttempt {
	return reaper.DeadAttempt{OptedIn: true, Task: asynqstate.TaskArchived, LastErr: asynqstate.ErrLeaseExpiredText,
		QueueServed: true, LiveProcesses: map[string]bool{"pod-live:1": true}}
}

// TestDecideDeadEarlyAsynqSide: with the row past its stall timeout and
// within max_runtime, each of asynq's conditions alone decides.
func TestDecideDeadEarlyAsynqSide(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	started, stall := now.Add(-20*time.Minute), 15*time.Minute
	row := func(worker string) *jobs.Snapshot {
		return &jobs.Snapshot{ID: "J", Type: "video.encode", Status: jobs.StatusProcessing, Generation: 1, Worker: worker, Queue: "video",
			StartedAt: &started, UpdatedAt: now.Add(-stall), Limits: &jobs.Limits{MaxRuntime: 2 * time.Hour, HardTimeout: ptr(4 * time.Hour)}}
	}
	cases := []struct {
		name   string
		worker string
		edit   func(*reaper.DeadAttempt)
		reap   bool
	}{
		{"ArchivedWithLeaseExpiredAndWorkerGone", deadWorker, func(*reaper.DeadAttempt) {}, true},
		{"CompletedWithLeaseExpired", deadWorker, func(a *reaper.DeadAttempt) { a.Task = asynqstate.TaskCompleted }, true},
		{"TaskGone", deadWorker, func(a *reaper.DeadAttempt) { a.Task, a.LastErr = asynqstate.TaskNotFound, "" }, true},
		{"QueueGone", deadWorker, func(a *reaper.DeadAttempt) { a.Task, a.LastErr = asynqstate.TaskQueueNotFound, "" }, true},
		{"TypeNotOptedIn", deadWorker, func(a *reaper.DeadAttempt) { a.OptedIn = false }, false},
		{"ArchivedByTheHandlersOwnError", deadWorker, func(a *reaper.DeadAttempt) { a.LastErr = "upstream timeout" }, false},
		{"ArchivedWithoutError", deadWorker, func(a *reaper.DeadAttempt) { a.LastErr = "" }, false},
		{"LeaseExpiredButRetrying", deadWorker, func(a *reaper.DeadAttempt) { a.Task = asynqstate.TaskRetry }, false},
		{"TaskStillActive", deadWorker, func(a *reaper.DeadAttempt) { a.Task = asynqstate.TaskActive }, false},
		{"TaskPending", deadWorker, func(a *reaper.DeadAttempt) { a.Task = asynqstate.TaskPending }, false},
		{"NoLiveServerServesTheQueue", deadWorker, func(a *reaper.DeadAttempt) { a.QueueServed = false }, false},
		{"WorkerStillInTheRegistry", deadWorker, func(a *reaper.DeadAttempt) { a.LiveProcesses[deadWorker] = true }, false},
		{"WorkerNamedWithWithWorker", "encoder-1", func(*reaper.DeadAttempt) {}, false},
		{"WorkerNameWithoutPid", "pod-7f9c:", func(*reaper.DeadAttempt) {}, false},
		{"WorkerNameWithNonNumericPid", "pod-7f9c:main", func(*reaper.DeadAttempt) {}, false},
		{"WorkerNameWithPidZero", "pod-7f9c:0", func(*reaper.DeadAttempt) {}, false},
		{"WorkerNameWithoutHost", ":4242", func(*reaper.DeadAttempt) {}, false},
		{"NoWorker", "", func(*reaper.DeadAttempt) {}, false},
		{"IPv6StyleHost", "fe80::1:4242", func(*reaper.DeadAttempt) {}, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			a := deadAttempt()
			tc.edit(&a)
			v := reaper.DecideDeadEarly(row(tc.worker), now, baselineRule, a)
			if v.Reap != tc.reap || v.Reap != v.Verdict.Reap || v.Reap == (v.Why != "") {
				t.Fatalf("DecideDeadEarly = %+v, want reap %v", v, tc.reap)
			}
		})
	}
	t.Run("NoRow", func(t *testing.T) {
		if v := reaper.DecideDeadEarly(nil, now, baselineRule, deadAttempt()); v.Reap {
			t.Fatalf("DecideDeadEarly(nil) = %+v", v)
		}
	})
}

func ptr[T any](v T) *T { return &v }

// deadEarlyCase is one row of the table that DecideDeadEarly, the
// candidate query and the dead-early compare-and-set must answer alike
// (asynq's side holding throughout).
type deadEarlyCase struct {
	name                    string
	maxRuntime, stall, hard string
	optedIn                 bool
	status                  string
	runtime, idle           time.Duration
	grace                   bool
	outageAgo               time.Duration
	reap                    bool
}

var deadEarlyTable = []deadEarlyCase{
	{name: "IdleEqualToStallTimeout", maxRuntime: "2 hours", hard: "4 hours", optedIn: true, runtime: 20 * time.Minute, idle: 15 * time.Minute, reap: true},
	{name: "IdleJustUnderStallTimeout", maxRuntime: "2 hours", hard: "4 hours", optedIn: true, runtime: 20 * time.Minute, idle: 15*time.Minute - us},
	{name: "TypesOwnStallTimeout", maxRuntime: "2 hours", stall: "20 minutes", hard: "4 hours", optedIn: true, runtime: 30 * time.Minute, idle: 20 * time.Minute, reap: true},
	{name: "TypesOwnStallTimeoutJustUnder", maxRuntime: "2 hours", stall: "20 minutes", hard: "4 hours", optedIn: true, runtime: 30 * time.Minute, idle: 20*time.Minute - us},
	{name: "NotOptedIn", maxRuntime: "2 hours", hard: "4 hours", runtime: 20 * time.Minute, idle: 15 * time.Minute},
	{name: "RuntimeAtMaxRuntimeIsStillEarly", maxRuntime: "2 hours", hard: "4 hours", optedIn: true, runtime: 2 * time.Hour, idle: time.Hour, reap: true},
	{name: "BadLimits", maxRuntime: "2 hours", stall: "5 minutes", hard: "4 hours", optedIn: true, runtime: 20 * time.Minute, idle: 15 * time.Minute},
	{name: "HardTimeoutTooShort", maxRuntime: "2 hours", optedIn: true, hard: "2 hours 15 minutes", runtime: 20 * time.Minute, idle: 15 * time.Minute},
	{name: "Queued", maxRuntime: "2 hours", hard: "4 hours", optedIn: true, status: jobs.StatusQueued, runtime: 20 * time.Minute, idle: 15 * time.Minute},
	{name: "OutageEndedJustUnderTheStallTimeoutAgo", maxRuntime: "2 hours", hard: "4 hours", optedIn: true, runtime: time.Hour, idle: 40 * time.Minute,
		grace: true, outageAgo: 15*time.Minute - us},
	{name: "OutageEndedTheStallTimeoutAgo", maxRuntime: "2 hours", hard: "4 hours", optedIn: true, runtime: time.Hour, idle: 40 * time.Minute,
		grace: true, outageAgo: 15 * time.Minute, reap: true},
}

// TestDeadEarlyRuleAgreesWithItsSQL runs every row against DecideDeadEarly
// (asynq's side holding), ListDeadEarlyCandidates and the dead-early
// compare-and-set of ReapBatch, in one transaction whose now() does not
// move; all must give the row's answer. The compare-and-set also refuses a
// row whose generation moved since the read.
func TestDeadEarlyRuleAgreesWithItsSQL(t *testing.T) {
	t.Parallel()
	db := jobstest.New(t)
	ctx := context.Background()
	for i, tc := range deadEarlyTable {
		t.Run(tc.name, func(t *testing.T) {
			tx, err := db.Pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = tx.Rollback(ctx) }()
			id, typ := fmt.Sprintf("job-%d", i), fmt.Sprintf("type-%d", i)
			insertBoundaryRow(t, tx, boundaryCase{maxRuntime: tc.maxRuntime, stall: tc.stall, hard: tc.hard, status: tc.status,
				runtime: tc.runtime, idle: tc.idle}, id, typ)
			if _, err := tx.Exec(ctx, `UPDATE job_types SET reap_dead_early = $2 WHERE name = $1`, typ, tc.optedIn); err != nil {
				t.Fatal(err)
			}
			if _, err := tx.Exec(ctx, `UPDATE jobs SET worker = $2 WHERE id = $1`, id, deadWorker); err != nil {
				t.Fatal(err)
			}
			store := pgstore.New(tx, pgstore.WithSchema(db.Schema))
			now, err := store.Now(ctx)
			if err != nil {
				t.Fatal(err)
			}
			rule := baselineRule
			if tc.grace {
				rule.OutageEnd = now.Add(-tc.outageAgo)
			}
			snap, err := store.Get(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			a := deadAttempt()
			a.OptedIn = tc.optedIn
			if v := reaper.DecideDeadEarly(&snap, now, rule, a); v.Reap != tc.reap {
				t.Errorf("DecideDeadEarly = %+v, want reap %v", v, tc.reap)
			}
			cands, err := store.ListDeadEarlyCandidates(ctx, pgstore.DeadEarlyCandidatesParams{Queues: []string{"boundary"}, Rule: rule})
			if err != nil {
				t.Fatal(err)
			}
			if found := len(cands) == 1 && cands[0].ID == id; found != tc.reap {
				t.Errorf("ListDeadEarlyCandidates found the job: %v, want %v", found, tc.reap)
			}
			cand := pgstore.ReapCandidate{JobID: id, Generation: snap.Generation, UpdatedAt: snap.UpdatedAt}
			if tc.reap {
				// A generation moved since the read: nothing changes.
				moved := cand
				moved.Generation++
				out, err := store.ReapBatch(ctx, pgstore.ReapBatchParams{Candidates: []pgstore.ReapCandidate{moved},
					Reason: jobs.ReasonLostTask, Rule: rule, DeadEarly: true})
				if err != nil || len(out.Reaped) != 0 || len(out.Changed) != 1 {
					t.Fatalf("dead-early CAS of a moved generation = %+v (%v), want changed", out, err)
				}
			}
			out, err := store.ReapBatch(ctx, pgstore.ReapBatchParams{Candidates: []pgstore.ReapCandidate{cand},
				Reason: jobs.ReasonLostTask, Rule: rule, DeadEarly: true})
			if err != nil {
				t.Fatal(err)
			}
			if reaped := len(out.Reaped) == 1; reaped != tc.reap {
				t.Fatalf("dead-early CAS reaped %v, want %v", reaped, tc.reap)
			}
			if tc.reap && (!out.Reaped[0].Evidence.DeadEarly || out.Reaped[0].Evidence.Reason != jobs.ReasonLostTask) {
				t.Errorf("evidence = %+v, want lost_task with dead_early", out.Reaped[0].Evidence)
			}
			if tc.reap {
				var n int
				if err := tx.QueryRow(ctx, `SELECT count(*) FROM job_events WHERE job_id = $1 AND kind = 'reaped'
   AND (detail->>'dead_early')::boolean AND detail->>'reason' = 'lost_task'`, id).Scan(&n); err != nil || n != 1 {
					t.Errorf("reaped events with dead_early = %d (%v), want 1", n, err)
				}
			}
		})
	}
}
