package main

import (
	"strings"
	"testing"
	"time"

	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
	"github.com/jobreaper/jobreaper/queue"
)

// run --once reads the outage end every replica records: with the outage
// grace on (--outage-grace, over the tests' environment, which turns it
// off), a job stalled by its updated_at but idle for less than the stall
// timeout since the last outage's end is held as outage_grace, in the
// summary and in a dry run's decisions; with the grace off it is reaped.
func TestRunOnceHoldsAJobIdleSinceBeforeTheLastOutage(t *testing.T) {
	t.Parallel()
	db := jobstest.New(t)
	rdb := realRedis(t)
	q, id := unique("grace"), unique("J-grace")
	db.JobType(t, "report.export", "30 minutes", "", "")
	db.Insert(t, jobstest.Job{ID: id, Type: "report.export", Generation: 1, Queue: q, Worker: "w1",
		StartedAgo: jobstest.Ago(31 * time.Minute), IdleAgo: 21 * time.Minute})
	activeTask(t, id, q)
	t.Cleanup(func() { rdb.Del(t.Context(), queue.MarkerKey(id)) })
	// Another daemon recorded an outage that ended a minute ago, on this
	// server as it runs now (so the pass records nothing itself).
	db.Exec(t, `INSERT INTO reaper_outages (database, outage_end, cause, timeline, postmaster_start, recorded_by, recorded_at)
SELECT current_database(), now() - interval '1 minute', 'connection_lost', (SELECT timeline_id FROM pg_control_checkpoint()),
       pg_postmaster_start_time(), 'other:1', now()`)

	r := run(t, onceArgs(db, q, "--outage-grace", "--output", "json")...)
	requireExit(t, r, exitOK)
	doc := requireOneJSONResult(t, r.stdout)
	if string(doc["reaped"]) != "0" || !strings.Contains(string(doc["skipped"]), `"outage_grace":1`) {
		t.Fatalf("pass with the grace: %s, want the job held as outage_grace", r.stdout)
	}
	dry := run(t, onceArgs(db, q, "--outage-grace", "--dry-run")...)
	requireExit(t, dry, exitOK)
	if !strings.Contains(dry.stdout, "skip outage_grace") {
		t.Fatalf("the dry run's decisions lack the hold:\n%s", dry.stdout)
	}
	if row := db.Read(t, id); row.Status != jobs.StatusProcessing {
		t.Fatalf("the held job is %+v", row)
	}

	r = run(t, onceArgs(db, q, "--output", "json")...)
	requireExit(t, r, exitOK)
	if doc := requireOneJSONResult(t, r.stdout); string(doc["reaped"]) != "1" {
		t.Fatalf("pass without the grace: %s, want the job reaped", r.stdout)
	}
}
