package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jobreaper/jobreaper/internal/fleettest"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
	"github.com/jobreaper/jobreaper/reaper"
)

// B51: two real daemons lead queue sets {a} and {b}; asynq knows queue c,
// whose stalled PROCESSING rows no daemon scans. The leader whose set
// sorts first warns once naming c and its count (the other says nothing)
// and exports jobreaper_uncovered_processing_jobs{queue="c"}; run --once
// --queues a lists c in uncovered_queues. A third daemon for {c} starts:
// the first leader logs that nothing is uncovered any more, once, and its
// gauge for c drops to 0.
func TestCase_B51_AQueueNoLeaderLeaseCoversIsReported(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	bin := fleettest.BuildJobreaper(t)
	db := jobstest.New(t)
	db.JobType(t, "report.export", "30 minutes", "", "")
	// The b51a- prefix sorts before b51b- and b51c-: A's leader lease key
	// (["b51a-..."]) is the first of the three.
	qa, qb, qc := unique("b51a"), unique("b51b"), unique("b51c")

	// asynq knows the three queues: its client SADDs a queue to
	// asynq:queues at every enqueue. c's rows' tasks are gone (lost), as
	// after a worker died on their last attempt.
	rdb := realRedis(t)
	if err := rdb.SAdd(ctx, "asynq:queues", qa, qb, qc).Err(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rdb.SRem(context.WithoutCancel(ctx), "asynq:queues", qa, qb, qc) })
	for i := range 3 {
		db.Insert(t, jobstest.Job{ID: fmt.Sprintf("%s-stalled-%d", qc, i), Type: "report.export", Generation: 1, Queue: qc,
			StartedAgo: jobstest.Ago(31 * time.Minute), IdleAgo: 21 * time.Minute})
	}
	// Within its limits: not counted.
	db.Insert(t, jobstest.Job{ID: qc + "-fresh", Type: "report.export", Generation: 1, Queue: qc,
		StartedAgo: jobstest.Ago(5 * time.Minute), IdleAgo: time.Minute})

	opts := func(name, q string) fleettest.DaemonOptions {
		return fleettest.DaemonOptions{Name: name, DatabaseURL: db.URL, RedisURL: redisTestURL(),
			Args: []string{"--schema", db.Schema, "--queues", q, "--interval", "1s", "--stall-timeout", "11m"}}
	}
	okPasses := func(d *fleettest.Daemon) float64 { return d.Metric("jobreaper_passes_total", `outcome="ok"`) }
	gauge := func(d *fleettest.Daemon) float64 {
		return d.Metric("jobreaper_uncovered_processing_jobs", `queue="`+qc+`"`)
	}
	a := fleettest.StartDaemon(t, bin, opts("replica A", qa))
	b := fleettest.StartDaemon(t, bin, opts("replica B", qb))
	fleettest.WaitFor(t, "both lead", func() bool { return a.Leads() && b.Leads() })

	warned := a.AwaitLog(t, 0, "level=WARN", "uncovered queues:", "uncovered."+qc+"=3")
	fleettest.WaitFor(t, "A exports c's count", func() bool { return gauge(a) == 3 })
	aPasses, bPasses := okPasses(a), okPasses(b)
	fleettest.WaitFor(t, "both ran three more passes", func() bool {
		return okPasses(a) >= aPasses+3 && okPasses(b) >= bPasses+3
	})
	if n := a.Log.Count("level=WARN", "uncovered queues:"); n != 1 {
		t.Fatalf("A warned %d times about the uncovered queue, want once while nothing changes:\n%s", n, a.Log.String())
	}
	if n := b.Log.Count("uncovered queues:"); n != 0 {
		t.Fatalf("B, whose queue set does not sort first, logged about uncovered queues %d times:\n%s", n, b.Log.String())
	}
	if v := gauge(b); v != 0 {
		t.Fatalf("B exports %v for c, want 0 (not exported)", v)
	}

	// run --once --queues a holds no lease: its own queues and the live
	// leases cover a and b, not c.
	r := run(t, onceArgs(db, qa, "--output", "json")...)
	requireExit(t, r, exitOK)
	doc := requireOneJSONResult(t, r.stdout)
	var uncovered map[string]int
	if err := json.Unmarshal(doc["uncovered_queues"], &uncovered); err != nil {
		t.Fatalf("uncovered_queues %s: %v", doc["uncovered_queues"], err)
	}
	if len(uncovered) != 1 || uncovered[qc] != 3 {
		t.Fatalf("uncovered_queues = %s, want {%q: 3}", doc["uncovered_queues"], qc)
	}
	text := run(t, onceArgs(db, qa)...)
	requireExit(t, text, exitOK)
	if want := fmt.Sprintf(", uncovered_queues %s 3 (", qc); !strings.Contains(text.stdout, want) {
		t.Fatalf("text summary %q lacks %q", text.stdout, want)
	}
	// With --queues c too, c is covered by the run itself.
	both := run(t, onceArgs(db, qa+","+qc, "--output", "json")...)
	if got := string(requireOneJSONResult(t, both.stdout)["uncovered_queues"]); got != "{}" {
		t.Fatalf("run --once --queues a,c: uncovered_queues = %s, want {}", got)
	}

	// A daemon for {c}: c is covered from its first leader lease on.
	c := fleettest.StartDaemon(t, bin, opts("replica C", qc))
	fleettest.WaitFor(t, "C leads", c.Leads)
	a.AwaitLog(t, warned, "level=INFO", "uncovered queues: none")
	fleettest.WaitFor(t, "A's gauge for c drops to 0", func() bool { return gauge(a) == 0 })
	// The series stays, at 0, so that an alert sees it recover.
	if _, body := a.Probe("/metrics"); !strings.Contains(body, `jobreaper_uncovered_processing_jobs{queue="`+qc+`"} 0`) {
		t.Fatalf("A's /metrics has no series for c at 0:\n%s", body)
	}
	aPasses = okPasses(a)
	fleettest.WaitFor(t, "A ran three more passes", func() bool { return okPasses(a) >= aPasses+3 })
	if n := a.Log.Count("uncovered queues:"); n != 2 {
		t.Fatalf("A logged about uncovered queues %d times, want twice (the warning, then none left):\n%s", n, a.Log.String())
	}
	if n := c.Log.Count("uncovered queues:"); n != 0 {
		t.Fatalf("C logged about uncovered queues %d times:\n%s", n, c.Log.String())
	}
}

// The JSON summary always has uncovered_queues, {} when none (also a dry
// run's document); the text line names each queue and its count only when
// there is one.
func TestSummaryNamesUncoveredQueues(t *testing.T) {
	t.Parallel()
	for _, dry := range []bool{false, true} {
		var js bytes.Buffer
		if err := (&app{stdout: &js}).printSummary(reaper.Result{}, outputJSON, runMode{dryRun: dry}, ""); err != nil {
			t.Fatal(err)
		}
		var doc map[string]json.RawMessage
		if err := json.Unmarshal(js.Bytes(), &doc); err != nil || string(doc["uncovered_queues"]) != "{}" {
			t.Fatalf("dry run %v: uncovered_queues %s (%v), want {}: %s", dry, doc["uncovered_queues"], err, js.String())
		}
	}
	res := reaper.Result{UncoveredQueues: map[string]int{"reports-eu": 3, "crawl": 1}}
	var js, text bytes.Buffer
	if err := printResult(&js, res, outputJSON, ""); err != nil {
		t.Fatal(err)
	}
	if got := string(requireOneJSONResult(t, js.String())["uncovered_queues"]); got != `{"crawl":1,"reports-eu":3}` {
		t.Fatalf("uncovered_queues %s", got)
	}
	if err := printResult(&text, res, outputText, ""); err != nil {
		t.Fatal(err)
	}
	if want := ", uncovered_queues crawl 1 reports-eu 3 (stalled PROCESSING jobs"; !strings.Contains(text.String(), want) {
		t.Fatalf("text summary lacks %q:\n%s", want, text.String())
	}
	text.Reset()
	if err := printResult(&text, reaper.Result{UncoveredQueues: map[string]int{}}, outputText, ""); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(text.String(), "uncovered") {
		t.Fatalf("a summary without uncovered queues names them:\n%s", text.String())
	}
}
