package main

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
	"github.com/jobreaper/jobreaper/queue"
	"github.com/jobreaper/jobreaper/queue/queuetest"
)

// requireRow fails the test unless id's row has status and generation.
func requireRow(t *testing.T, db *jobstest.DB, id, status string, generation int64) {
	t.Helper()
	if row := db.Read(t, id); row.Status != status || row.Generation != generation {
		t.Fatalf("job %s = %s at generation %d, want %s at generation %d", id, row.Status, row.Generation, status, generation)
	}
}

func TestRequeueByFilter(t *testing.T) {
	t.Parallel()
	f := newRequeueFixture(t)
	f.db.JobType(t, "mail.send", "30 minutes", "", "6 hours")
	other := "other_" + f.db.Schema
	t.Cleanup(func() { _ = queuetest.Remove(context.Background(), f.rdb, other) })

	// Two jobs the filter takes, reaped as a reap leaves them: a stalled
	// one and a lost one. The lost one failed a second later.
	stalled, lost := f.q+"-A-stalled", f.q+"-B-lost"
	f.reaped(t, stalled)
	f.reaped(t, lost)
	f.db.Exec(t, `UPDATE jobs SET failure_reason = 'lost_task', finished_at = finished_at + interval '1 second' WHERE id = $1`, lost)

	// And jobs it must not take: each differs from the taken ones in one
	// respect only.
	failed := func(id, typ, q, reason, ago string) {
		f.db.Insert(t, jobstest.Job{ID: id, Type: typ, Status: jobs.StatusQueued, Queue: q})
		f.db.Exec(t, `UPDATE jobs SET status = 'FAILED', failure_reason = $2, generation = 1,
       finished_at = now() - $3::interval, marker_set_at = now() WHERE id = $1`, id, reason, ago)
	}
	cancelled := f.q + "-C-cancelled"
	failed(cancelled, "report.export", f.q, "cancelled", "0 s")
	otherType := f.q + "-D-type"
	failed(otherType, "mail.send", f.q, "stalled", "0 s")
	otherQueue := f.q + "-E-queue"
	failed(otherQueue, "report.export", other, "stalled", "0 s")
	tooOld := f.q + "-F-old"
	failed(tooOld, "report.export", f.q, "stalled", "5 hours")
	tooNew := f.q + "-G-new"
	failed(tooNew, "report.export", f.q, "stalled", "0 s") // finished after --failed-until, below
	queued := f.q + "-H-queued"
	f.db.Insert(t, jobstest.Job{ID: queued, Type: "report.export", Status: jobs.StatusQueued, Queue: f.q})
	untouched := []string{cancelled, otherType, otherQueue, tooOld, tooNew}

	filter := []string{"--reason", "upstream fixed", "--failed-since", "2h", "--failed-until", "2099-01-01T00:00:00Z",
		"--where-type", "report.export", "--queues", f.q, "--where-failure", "stalled,lost_task", "--limit", "100"}
	f.db.Exec(t, `UPDATE jobs SET finished_at = '2100-01-01T00:00:00Z' WHERE id = $1`, tooNew)

	t.Run("DryRunPrintsTheCountAndChangesNothing", func(t *testing.T) {
		r := run(t, f.args(slices.Concat(filter, []string{"--dry-run", "--output", "json"})...)...)
		requireExit(t, r, exitOK)
		var line dryRunLine
		if err := json.Unmarshal([]byte(r.stdout), &line); err != nil || strings.Count(r.stdout, "\n") != 1 {
			t.Fatalf("stdout %q is not one JSON line (%v)", r.stdout, err)
		}
		if !line.DryRun || line.Matched != 2 || line.Selected != 2 || line.Limit != 100 ||
			len(line.JobIDs) != 2 || line.JobIDs[0] != stalled || line.JobIDs[1] != lost {
			t.Fatalf("dry run = %+v, want 2 matched and selected: %s, %s", line, stalled, lost)
		}
		r = run(t, f.args(slices.Concat(filter[:len(filter)-2], []string{"--limit", "1", "--dry-run"})...)...)
		requireExit(t, r, exitOK)
		want := `dry run: 2 job(s) match; a run would requeue 1 of them (--limit 1); nothing changed; first IDs: "` + stalled + `"` + "\n"
		if r.stdout != want {
			t.Fatalf("text dry run = %q, want %q", r.stdout, want)
		}
		for _, id := range []string{stalled, lost} {
			requireRow(t, f.db, id, jobs.StatusFailed, 1)
			if st := f.taskState(t, id); st != "archived" {
				t.Fatalf("task of %s is %s after a dry run, want archived", id, st)
			}
		}
		if n := f.db.Count(t, `SELECT count(*) FROM job_events WHERE kind = 'requeued'`); n != 0 {
			t.Fatalf("requeued events after a dry run = %d, want 0", n)
		}
	})

	t.Run("RequeuesExactlyTheFilteredJobs", func(t *testing.T) {
		r := run(t, f.args(slices.Concat(filter, []string{"--output", "json"})...)...)
		requireExit(t, r, exitOK)
		lines := strings.Split(strings.TrimSuffix(r.stdout, "\n"), "\n")
		if len(lines) != 2 {
			t.Fatalf("stdout has %d lines, want 2: %q", len(lines), r.stdout)
		}
		for i, id := range []string{stalled, lost} {
			var line requeueLine
			if err := json.Unmarshal([]byte(lines[i]), &line); err != nil {
				t.Fatal(err)
			}
			if line.JobID != id || line.Outcome != outcomeRequeued || line.TaskState != "archived" || line.Generation == nil || *line.Generation != 2 {
				t.Fatalf("line %d = %+v, want %s requeued from its archived task at generation 2", i, line, id)
			}
			requireRow(t, f.db, id, jobs.StatusQueued, 2)
			if st := f.taskState(t, id); st != "pending" {
				t.Fatalf("task of %s is %s, want pending", id, st)
			}
			if n := f.db.Count(t, `SELECT count(*) FROM job_events WHERE job_id = $1 AND kind = 'requeued' AND detail->>'reason' = 'upstream fixed'`, id); n != 1 {
				t.Fatalf("requeued events of %s = %d, want 1", id, n)
			}
		}
		for _, id := range untouched {
			requireRow(t, f.db, id, jobs.StatusFailed, 1)
		}
		requireRow(t, f.db, queued, jobs.StatusQueued, 0)
		if n := f.db.Count(t, `SELECT count(*) FROM job_events WHERE kind = 'requeued'`); n != 2 {
			t.Fatalf("requeued events = %d, want 2", n)
		}

		// Run again: the two are QUEUED now, nothing else matches.
		r = run(t, f.args(filter...)...)
		requireExit(t, r, exitOK)
		if r.stdout != "" {
			t.Fatalf("second run printed %q, want nothing", r.stdout)
		}
	})
}

func TestBulkUsageErrorsExitTwo(t *testing.T) {
	t.Parallel()
	db := jobstest.New(t)
	requeue := []string{"requeue", "--database-url", db.URL, "--schema", db.Schema, "--redis-url", e2eRedisURL, "--reason", "x"}
	cancel := opsArgs(db, "cancel", "--reason", "x")
	cases := []struct {
		base []string
		args string
		want string
	}{
		{requeue, "--failed-since 2h", "--limit N is required"},
		{requeue, "--failed-since 2h --limit 10001", "--limit 10001 is not between 1 and 10000"},
		{requeue, "--failed-since 2h --limit 0", "--limit 0 is not between 1 and 10000"},
		{requeue, "--where-type a --limit 5", "--failed-since TIME is required"},
		{requeue, "--failed-until 1h --limit 5", "--failed-since TIME is required"},
		{requeue, "--failed-since yesterday --limit 5", `--failed-since "yesterday" is neither an RFC 3339 time`},
		{requeue, "--failed-since 2h --limit 5 J1", "give job IDs, --stale or --failed-since, only one of them"},
		{requeue, "--failed-since 2h --limit 5 --stale", "give job IDs, --stale or --failed-since, only one of them"},
		{requeue, "--failed-since 2h --limit 5 --where-failure stalled,,lost_task", "--where-failure item 2 is empty"},
		{cancel, "--created-since 2h", "--limit N is required"},
		{cancel, "--started-before 2h --limit 10001", "--limit 10001 is not between 1 and 10000"},
		{cancel, "--where-type a --limit 5", "--created-since or --started-before is required"},
		{cancel, "--queues q --limit 5 --dry-run", "--created-since or --started-before is required"},
		{cancel, "--created-since 2h --limit 5 J1", "give job IDs or a time filter, not both"},
		{cancel, "--started-before -2h --limit 5", `--started-before "-2h" is neither`},
		{cancel, "", "give the IDs of the jobs to cancel, or a time filter"},
	}
	for _, c := range cases {
		r := run(t, append(append([]string{}, c.base...), strings.Fields(c.args)...)...)
		requireExit(t, r, exitCannotRun)
		requireOneLineError(t, r, c.want)
	}
}

func TestCancelByFilter(t *testing.T) {
	t.Parallel()
	f := newRequeueFixture(t) // a schema, a queue and the type report.export
	db := f.db
	db.JobType(t, "mail.send", "30 minutes", "", "")
	var all []string
	job := func(name, status, typ, q, createdAgo string, startedAgo *string) string {
		id := f.q + "-" + name
		all = append(all, id)
		db.Insert(t, jobstest.Job{ID: id, Type: typ, Status: status, Queue: q})
		db.Exec(t, `UPDATE jobs SET created_at = now() - $2::interval, started_at = now() - $3::interval WHERE id = $1`, id, createdAgo, startedAgo)
		return id
	}
	t.Cleanup(func() {
		for _, id := range all {
			f.rdb.Del(context.Background(), queue.MarkerKey(id))
		}
	})
	hour2, min5 := "2 hours", "5 minutes"
	newQueued := job("A-queued", jobs.StatusQueued, "report.export", f.q, "10 minutes", nil)
	newRunning := job("B-running", jobs.StatusProcessing, "report.export", f.q, "9 minutes", &min5)
	oldQueued := job("C-old", jobs.StatusQueued, "report.export", f.q, "3 hours", nil)
	otherType := job("D-type", jobs.StatusQueued, "mail.send", f.q, "10 minutes", nil)
	otherQueue := job("E-queue", jobs.StatusQueued, "report.export", "elsewhere_"+db.Schema, "10 minutes", nil)
	hung := job("F-hung", jobs.StatusProcessing, "report.export", f.q, "3 hours", &hour2)
	// A QUEUED job whose past attempt started long ago: --started-before
	// selects running attempts only.
	retried := job("G-retried", jobs.StatusQueued, "report.export", f.q, "3 hours", &hour2)

	created := []string{"--reason", "upstream outage", "--created-since", "1h", "--where-type", "report.export", "--queues", f.q, "--limit", "50"}

	t.Run("DryRunPrintsTheCountAndChangesNothing", func(t *testing.T) {
		r := run(t, opsArgs(db, append([]string{"cancel"}, append(created, "--dry-run", "--output", "json")...)...)...)
		requireExit(t, r, exitOK)
		var line dryRunLine
		if err := json.Unmarshal([]byte(r.stdout), &line); err != nil {
			t.Fatalf("stdout %q: %v", r.stdout, err)
		}
		if line.Matched != 2 || len(line.JobIDs) != 2 || line.JobIDs[0] != newQueued || line.JobIDs[1] != newRunning {
			t.Fatalf("dry run = %+v, want %s and %s (oldest first)", line, newQueued, newRunning)
		}
		requireRow(t, db, newQueued, jobs.StatusQueued, 0)
		requireRow(t, db, newRunning, jobs.StatusProcessing, 0)
	})

	t.Run("CancelsExactlyTheFilteredJobs", func(t *testing.T) {
		r := run(t, opsArgs(db, append([]string{"cancel"}, created...)...)...)
		requireExit(t, r, exitOK)
		want := "cancelled job \"" + newQueued + "\" (was QUEUED, generation 0): marker set, no running handler to cancel (asynq holds no task for it)\n" +
			"cancelled job \"" + newRunning + "\" (was PROCESSING, generation 0): marker set, no running handler to cancel (asynq holds no task for it)\n"
		if r.stdout != want {
			t.Fatalf("stdout = %q, want %q", r.stdout, want)
		}
		for _, id := range []string{newQueued, newRunning} {
			if row := db.Read(t, id); row.Status != jobs.StatusFailed || row.FailureReason != "cancelled" {
				t.Fatalf("job %s = %+v, want FAILED cancelled", id, row)
			}
		}
		requireRow(t, db, oldQueued, jobs.StatusQueued, 0)
		requireRow(t, db, otherType, jobs.StatusQueued, 0)
		requireRow(t, db, otherQueue, jobs.StatusQueued, 0)
		requireRow(t, db, hung, jobs.StatusProcessing, 0)
		requireRow(t, db, retried, jobs.StatusQueued, 0)
	})

	t.Run("StartedBeforeTakesOnlyRunningAttempts", func(t *testing.T) {
		r := run(t, opsArgs(db, "cancel", "--reason", "hung on the old API", "--started-before", "1h", "--limit", "50", "--output", "json")...)
		requireExit(t, r, exitOK)
		var line cancelLine
		if err := json.Unmarshal([]byte(r.stdout), &line); err != nil || strings.Count(r.stdout, "\n") != 1 {
			t.Fatalf("stdout %q is not one JSON line (%v)", r.stdout, err)
		}
		if line.JobID != hung || line.Outcome != outcomeCancelled || line.FromStatus != jobs.StatusProcessing {
			t.Fatalf("line = %+v, want %s cancelled from PROCESSING", line, hung)
		}
		requireRow(t, db, retried, jobs.StatusQueued, 0)
		requireRow(t, db, oldQueued, jobs.StatusQueued, 0)
	})
}
