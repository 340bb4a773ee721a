package reaper_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/jobreaper/jobreaper/internal/asynqstate"
	"github.com/jobreaper/jobreaper/internal/pgstore"
	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
	"github.com/jobreaper/jobreaper/reaper"
)

// Case B47's outages themselves (a shared outage, a restart while the
// daemon was down) run against real processes in cmd/jobreaper
// (TestCase_B47_ASharedOutage, TestReliabilityBlip_ARestartWhileTheDaemonWasDown).
// What stays here is what needs no outage: a statement that fails on every
// pass is no outage.

// TestCase_B47_AStatementThatFailsEveryPassIsNoOutage: an on_failed
// cascade that fails for one job on every pass, with a serialization
// failure (an error the finalization retries count as transient) and
// division by zero, is a server's answer, not a lost connection: it
// records no outage end, and the other stalled jobs are reaped at once,
// pass after pass.
func TestCase_B47_AStatementThatFailsEveryPassIsNoOutage(t *testing.T) {
	ctx := t.Context()
	db := jobstest.New(t)
	db.JobType(t, "report.export", "30 minutes", "", "")
	db.Exec(t, `CREATE FUNCTION fail_for(id text) RETURNS int LANGUAGE plpgsql AS $$
BEGIN
    IF id LIKE 'broken-serial%' THEN RAISE EXCEPTION 'the cascade fails for %', id USING ERRCODE = '40001'; END IF;
    IF id LIKE 'broken-zero%' THEN RETURN 1 / 0; END IF;
    RETURN 1;
END $$`)
	// An outage end long before the jobs' last progress, as the first
	// pass after migrate on a server up for a day would have recorded.
	db.Exec(t, `INSERT INTO reaper_outages (database, outage_end, cause, timeline, postmaster_start, recorded_by, recorded_at)
SELECT current_database(), now() - interval '1 day', 'first_record', (SELECT timeline_id FROM pg_control_checkpoint()),
       pg_postmaster_start_time(), 'test', now()`)
	var before time.Time
	if err := db.Pool.QueryRow(ctx, `SELECT outage_end FROM reaper_outages`).Scan(&before); err != nil {
		t.Fatal(err)
	}
	watch := pgstore.NewConnWatch(2 * time.Second)
	daemonCut := db.Cuttable(t, watch.Install)
	store := pgstore.New(daemonCut.Pool, pgstore.WithSchema(db.Schema), pgstore.WithConnWatch(watch),
		pgstore.WithCascades(jobs.Cascades{"report.export": {OnFailed: []string{`SELECT fail_for(@job_id)`}}}))
	if err := store.PrepareCascades(ctx); err != nil {
		t.Fatal(err)
	}
	lister := &fakeLister{queues: map[string]asynqstate.ActiveTasks{"q": {}}, failed: map[string]error{}}
	reg := prometheus.NewRegistry()
	r := reaper.New(store, lister, newMarkers(t, miniRedisClient(t)), reaper.Options{Queues: []string{"q"}, Rule: baselineRule,
		OutageGrace: true, Logger: testLogger(t), Metrics: reaper.NewMetrics(reg)})
	broken := []string{"broken-serial", "broken-zero"}
	stalledRows(t, db, "q", 21*time.Minute, broken...)
	for pass := 1; pass <= 3; pass++ {
		ok := fmt.Sprintf("ok-%d", pass)
		stalledRows(t, db, "q", 21*time.Minute, ok)
		lister.queues["q"] = asynqstate.ActiveTasks{IDs: append([]string{ok}, broken...)}
		res, err := r.RunOnce(ctx)
		if err != nil || res.Reaped != 1 || res.Errors != len(broken) || res.Skipped[string(reaper.SkipOutageGrace)] != 0 {
			t.Fatalf("pass %d = %+v, %v; want %s reaped, the broken cascades' errors, nothing held", pass, res, err, ok)
		}
		if st := db.Read(t, ok); st.Status != jobs.StatusFailed || st.FailureReason != jobs.ReasonStalled {
			t.Fatalf("pass %d: %s is %+v, want reaped", pass, ok, st)
		}
	}
	// One more pass (the broken jobs, no longer active, fail again in the
	// lost-task search): it would record an outage end had the cascade's
	// errors counted as lost connections.
	lister.queues["q"] = asynqstate.ActiveTasks{}
	if res, err := r.RunOnce(ctx); err != nil || res.Reaped != 0 {
		t.Fatalf("the pass after = %+v, %v", res, err)
	}
	var end time.Time
	var cause string
	if err := db.Pool.QueryRow(ctx, `SELECT outage_end, cause FROM reaper_outages`).Scan(&end, &cause); err != nil || !end.Equal(before) || cause != "first_record" {
		t.Fatalf("outage row %s (%s, %v), want it untouched at %s", end, cause, err, before)
	}
	if n := db.Count(t, `SELECT count(*) FROM jobs WHERE id = ANY($1) AND status = 'PROCESSING'`, broken); n != int64(len(broken)) {
		t.Fatalf("%d of the broken jobs are still PROCESSING, want %d (their cascade fails, so nothing of them is written)", n, len(broken))
	}
}
