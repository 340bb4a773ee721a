package main

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
	"github.com/jobreaper/jobreaper/queue"
	"github.com/jobreaper/jobreaper/reaper"
)

// run --once --dry-run over stalled jobs changes no row, event or marker,
// and lists every decision: as one JSON document and as text.
func TestRunOnceDryRun(t *testing.T) {
	t.Parallel()
	db := jobstest.New(t)
	rdb := realRedis(t)
	q := unique("dry")
	db.JobType(t, "report.export", "30 minutes", "", "")
	stalled, fresh := unique("J-stalled"), unique("J-fresh")
	db.Insert(t, jobstest.Job{ID: stalled, Type: "report.export", Generation: 1, Queue: q, Worker: "w1",
		StartedAgo: jobstest.Ago(31 * time.Minute), IdleAgo: 21 * time.Minute})
	db.Insert(t, jobstest.Job{ID: fresh, Type: "report.export", Generation: 1, Queue: q, Worker: "w2",
		StartedAgo: jobstest.Ago(2 * time.Minute), IdleAgo: time.Minute})
	activeTask(t, stalled, q)
	activeTask(t, fresh, q)
	t.Cleanup(func() { rdb.Del(t.Context(), queue.MarkerKey(stalled), queue.MarkerKey(fresh)) })
	before := db.Read(t, stalled)

	r := run(t, onceArgs(db, q, "--dry-run", "--output", "json")...)
	requireExit(t, r, exitOK)
	var doc struct {
		Scanned, Reaped, Errors int
		Skipped                 map[string]int
		Decisions               []reaper.Decision
	}
	if err := json.Unmarshal([]byte(r.stdout), &doc); err != nil || strings.Count(r.stdout, "\n") != 1 {
		t.Fatalf("stdout is not one JSON document: %v\n%s", err, r.stdout)
	}
	if doc.Scanned != 2 || doc.Reaped != 1 || doc.Skipped["within_limit"] != 1 || len(doc.Decisions) != 2 {
		t.Fatalf("dry run = %+v", doc)
	}
	// The dry run accounts for every scanned task as a real pass does:
	// the job it would reap as stalled.
	requireScannedAddsUp(t, r.stdout)
	if !strings.Contains(r.stdout, `"scanned_by":{"stalled":1,"within_limit":1}`) {
		t.Fatalf("dry run JSON lacks scanned_by:\n%s", r.stdout)
	}
	// Empty lists and maps are [] and {}, as in a real pass's summary.
	if !strings.Contains(r.stdout, `"queues_not_found":[]`) || !strings.Contains(r.stdout, `"lost_task":0`) {
		t.Fatalf("dry run JSON has null where a real pass has [] or a reason missing:\n%s", r.stdout)
	}
	for _, d := range doc.Decisions {
		switch d.JobID {
		case stalled:
			if d.Decision != "reap" || d.Reason != "stalled" || d.Worker != "w1" || d.Generation != 1 || d.Queue != q ||
				d.Type != "report.export" || d.MaxRuntimeSeconds != 1800 || d.StallTimeoutSeconds != 900 || d.IdleSeconds < 21*60 {
				t.Errorf("decision on the stalled job = %+v", d)
			}
		case fresh:
			if d.Decision != "skip" || d.Reason != "within_limit" {
				t.Errorf("decision on the fresh job = %+v", d)
			}
		default:
			t.Errorf("decision on an unknown job: %+v", d)
		}
	}
	if after := db.Read(t, stalled); after != before {
		t.Fatalf("the dry run changed the stalled job: %+v -> %+v", before, after)
	}
	if n := db.Count(t, `SELECT count(*) FROM `+db.Table("job_events")); n != 0 {
		t.Fatalf("the dry run wrote %d events", n)
	}
	if n, err := rdb.Exists(t.Context(), queue.MarkerKey(stalled)).Result(); err != nil || n != 0 {
		t.Fatalf("the dry run wrote a marker (%d, %v)", n, err)
	}

	text := run(t, onceArgs(db, q, "--dry-run")...)
	requireExit(t, text, exitOK)
	if !strings.Contains(text.stdout, "dry run, nothing written: would reap 1 of 2 job(s) looked at") ||
		!strings.Contains(text.stdout, "REAP stalled") || !strings.Contains(text.stdout, "skip within_limit") {
		t.Fatalf("text output:\n%s", text.stdout)
	}
	if row := db.Read(t, stalled); row.Status != jobs.StatusProcessing {
		t.Fatalf("stalled job after two dry runs = %+v", row)
	}

	daemon := run(t, "run", "--dry-run", "--database-url", db.URL)
	requireExit(t, daemon, exitCannotRun)
	requireOneLineError(t, daemon, "--dry-run applies to --once only")
}

// run --once --dry-run --output json marks each decision at_risk or not
// and counts them in the summary's at_risk; the reasons are unchanged.
func TestRunOnceDryRunMarksJobsAtRisk(t *testing.T) {
	t.Parallel()
	db := jobstest.New(t)
	rdb := realRedis(t)
	q := unique("dryrisk")
	db.JobType(t, "report.export", "30 minutes", "", "")
	stalled, risky, busy := unique("J-stalled"), unique("J-risky"), unique("J-busy")
	db.Insert(t, jobstest.Job{ID: stalled, Type: "report.export", Generation: 1, Queue: q, Worker: "w1",
		StartedAgo: jobstest.Ago(31 * time.Minute), IdleAgo: 21 * time.Minute})
	db.Insert(t, jobstest.Job{ID: risky, Type: "report.export", Generation: 1, Queue: q, Worker: "w2",
		StartedAgo: jobstest.Ago(45 * time.Minute), IdleAgo: 10 * time.Minute})
	db.Insert(t, jobstest.Job{ID: busy, Type: "report.export", Generation: 1, Queue: q, Worker: "w3",
		StartedAgo: jobstest.Ago(45 * time.Minute), IdleAgo: 2 * time.Minute})
	for _, id := range []string{stalled, risky, busy} {
		activeTask(t, id, q)
	}
	t.Cleanup(func() { rdb.Del(t.Context(), queue.MarkerKey(stalled)) })

	r := run(t, onceArgs(db, q, "--dry-run", "--output", "json")...)
	requireExit(t, r, exitOK)
	var doc struct {
		Reaped    int  `json:"reaped"`
		AtRisk    *int `json:"at_risk"`
		Decisions []map[string]any
	}
	if err := json.Unmarshal([]byte(r.stdout), &doc); err != nil {
		t.Fatalf("stdout is not one JSON document: %v\n%s", err, r.stdout)
	}
	if doc.Reaped != 1 || doc.AtRisk == nil || *doc.AtRisk != 1 || len(doc.Decisions) != 3 {
		t.Fatalf("dry run = %+v:\n%s", doc, r.stdout)
	}
	want := map[string]struct {
		reason string
		atRisk bool
	}{stalled: {"stalled", false}, risky: {"progressing", true}, busy: {"progressing", false}}
	for _, d := range doc.Decisions {
		w, ok := want[d["job_id"].(string)]
		if !ok || d["reason"] != w.reason || d["at_risk"] != w.atRisk {
			t.Errorf("decision %v, want reason %s at_risk %v", d, w.reason, w.atRisk)
		}
	}
	text := run(t, onceArgs(db, q, "--dry-run")...)
	requireExit(t, text, exitOK)
	if !strings.Contains(text.stdout, "skip progressing") || !strings.Contains(text.stdout, "(at risk)") || !strings.Contains(text.stdout, "at_risk 1") {
		t.Fatalf("text output lacks the job at risk:\n%s", text.stdout)
	}
}

// The dry run says which reaps would be retries: reap (retry 1 of 2) for a
// type with budget left, reap (fail) for one without; the JSON decisions
// carry retry and retries, and the summary counts the retry in retried_by.
func TestRunOnceDryRunSaysRetryOrFail(t *testing.T) {
	t.Parallel()
	db := jobstest.New(t)
	rdb := realRedis(t)
	q := unique("dryretry")
	db.JobType(t, "report.export", "30 minutes", "", "")
	db.JobType(t, "report.retry", "30 minutes", "", "")
	db.Exec(t, `UPDATE `+db.Table("job_types")+` SET reap_retries = 2 WHERE name = 'report.retry'`)
	retry, fail := unique("J-retry"), unique("J-fail")
	for _, j := range []struct{ id, typ string }{{retry, "report.retry"}, {fail, "report.export"}} {
		db.Insert(t, jobstest.Job{ID: j.id, Type: j.typ, Generation: 1, Queue: q, Worker: "w1",
			StartedAgo: jobstest.Ago(31 * time.Minute), IdleAgo: 21 * time.Minute})
		activeTask(t, j.id, q)
	}
	t.Cleanup(func() { rdb.Del(t.Context(), queue.MarkerKey(retry), queue.MarkerKey(fail)) })

	r := run(t, onceArgs(db, q, "--dry-run", "--output", "json")...)
	requireExit(t, r, exitOK)
	var doc struct {
		Reaped    int               `json:"reaped"`
		RetriedBy map[string]int    `json:"retried_by"`
		Decisions []reaper.Decision `json:"decisions"`
		ReapedBy  map[string]int    `json:"reaped_by"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &doc); err != nil {
		t.Fatal(err)
	}
	if doc.Reaped != 2 || doc.ReapedBy["stalled"] != 2 || doc.RetriedBy["stalled"] != 1 || doc.RetriedBy["lost_task"] != 0 {
		t.Fatalf("dry run summary %s", r.stdout)
	}
	for _, d := range doc.Decisions {
		if want := map[string][2]int{retry: {1, 2}, fail: {0, 0}}[d.JobID]; d.Retry != want[0] || d.Retries != want[1] {
			t.Errorf("decision %+v, want retry %d of %d", d, want[0], want[1])
		}
	}
	text := run(t, onceArgs(db, q, "--dry-run")...)
	requireExit(t, text, exitOK)
	for _, want := range []string{retry + `" type report.retry`, "reap (retry 1 of 2)", "reap (fail)", "of them retried 1 (stalled 1, lost_task 0)"} {
		if !strings.Contains(text.stdout, want) {
			t.Errorf("text dry run lacks %q:\n%s", want, text.stdout)
		}
	}
	if row := db.Read(t, retry); row.Status != jobs.StatusProcessing || row.Generation != 1 {
		t.Fatalf("the dry run changed %s: %+v", retry, row)
	}
}
