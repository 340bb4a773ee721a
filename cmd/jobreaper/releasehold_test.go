package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
	"github.com/jobreaper/jobreaper/queue"
	"github.com/jobreaper/jobreaper/queue/queuetest"
)

// stormJobs inserts n PROCESSING jobs of typ in q, stalled by the CASES
// baseline (started 31 minutes ago, idle 21), makes their tasks active in
// the test Redis, and removes the queue and their markers at cleanup. It
// returns their IDs.
func stormJobs(t *testing.T, db *jobstest.DB, q, typ string, n int) []string {
	t.Helper()
	if db.Count(t, `SELECT count(*) FROM job_types WHERE name = $1`, typ) == 0 {
		db.JobType(t, typ, "30 minutes", "", "")
	}
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("%s-%04d", q, i)
	}
	db.Exec(t, `INSERT INTO jobs (id, type, status, generation, worker, queue, started_at, updated_at)
SELECT id, $2, 'PROCESSING', 1, 'w1', $3, now() - interval '31 minutes', now() - interval '21 minutes' FROM unnest($1::text[]) AS id`,
		ids, typ, q)
	rdb := realRedis(t)
	if err := queuetest.MakeActive(t.Context(), rdb, q, typ, ids); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx := context.WithoutCancel(t.Context())
		_ = queuetest.Remove(ctx, rdb, q)
		for start := 0; start < len(ids); start += 1000 {
			keys := make([]string, 0, 1000)
			for _, id := range ids[start:min(start+1000, len(ids))] {
				keys = append(keys, queue.MarkerKey(id))
			}
			rdb.Del(ctx, keys...)
		}
	})
	return ids
}

// onceSummary is what the stall-storm tests read of run --once's JSON.
type onceSummary struct {
	Scanned         int            `json:"scanned"`
	Reaped          int            `json:"reaped"`
	Errors          int            `json:"errors"`
	StallStormHeld  int            `json:"stall_storm_held"`
	Skipped         map[string]int `json:"skipped"`
	StallStormHolds []struct {
		ID      int64     `json:"id"`
		Queues  []string  `json:"queues"`
		Types   []string  `json:"types"`
		Held    int       `json:"held"`
		Started bool      `json:"started"`
		Tripped string    `json:"tripped"`
		Until   time.Time `json:"until"`
	} `json:"stall_storm_holds"`
}

// once runs `run --once --output json` over db and queues with extra
// arguments and returns its exit code and summary.
func once(t *testing.T, db *jobstest.DB, queues string, extra ...string) (int, onceSummary) {
	t.Helper()
	args := append([]string{"run", "--once", "--output", "json", "--database-url", db.URL, "--schema", db.Schema,
		"--redis-url", redisTestURL(), "--queues", queues, "--log-level", "warn"}, extra...)
	r := run(t, args...)
	var sum onceSummary
	if err := json.Unmarshal([]byte(r.stdout), &sum); err != nil {
		t.Fatalf("run --once: %v\nstdout %s\nstderr %s", err, r.stdout, r.stderr)
	}
	return r.code, sum
}

// release-hold, the real command: while a hold is on, run --once exits 1
// and says so in its summary (text and JSON); release-hold refuses to run
// without a reason, ends the hold at once, records who and why, and exits
// 1 when no hold is left to end; the next run --once reaps all 200 jobs
// still stalled in one pass and exits 0.
func TestReleaseHoldEndsAStallStormHoldAtOnce(t *testing.T) {
	t.Parallel()
	db := jobstest.New(t)
	q, other := unique("release"), unique("release-other")
	ids := stormJobs(t, db, q, "report.export", 200)

	code, sum := once(t, db, q)
	if code != exitPassErrors || sum.Reaped != 0 || sum.StallStormHeld != 200 || sum.Errors != 0 ||
		len(sum.StallStormHolds) != 1 || !sum.StallStormHolds[0].Started || sum.StallStormHolds[0].Held != 200 {
		t.Fatalf("storm pass: exit %d, %+v; want exit 1, 200 held by a hold it started", code, sum)
	}
	hold := sum.StallStormHolds[0]
	if until := time.Until(hold.Until); until < 14*time.Minute || until > 16*time.Minute {
		t.Fatalf("hold until %s (in %s); want report.export's 15-minute stall timeout", hold.Until, until)
	}
	r := run(t, "run", "--once", "--database-url", db.URL, "--schema", db.Schema, "--redis-url", redisTestURL(), "--queues", q)
	requireExit(t, r, exitPassErrors)
	want := fmt.Sprintf("stall-storm hold %d on queues %s until %s: 200 stalled job(s) held (release it with jobreaper release-hold)",
		hold.ID, q, hold.Until.UTC().Format(time.RFC3339))
	if !strings.Contains(r.stdout, want) || !strings.Contains(r.stdout, "stall_storm_held 200") {
		t.Fatalf("summary line %q lacks %q", r.stdout, want)
	}

	r = run(t, "release-hold", "--database-url", db.URL, "--schema", db.Schema, "--queues", q)
	requireOneLineError(t, r, "release-hold needs --reason TEXT")
	requireExit(t, r, exitCannotRun)
	// A hold on other queues is not one of these.
	r = run(t, "release-hold", "--reason", "wrong queue", "--database-url", db.URL, "--schema", db.Schema, "--queues", other)
	requireExit(t, r, exitPassErrors)
	if !strings.Contains(r.stdout, "no stall-storm hold in effect for queues "+other+"; nothing released") {
		t.Fatalf("release-hold of another queue: %q", r.stdout)
	}

	r = run(t, "release-hold", "--reason", "the exports really hang: upstream down", "--output", "json",
		"--database-url", db.URL, "--schema", db.Schema, "--queues", q+","+other)
	requireExit(t, r, exitOK)
	var doc struct {
		Released []struct {
			ID         int64     `json:"id"`
			Queues     []string  `json:"queues"`
			Held       int       `json:"held"`
			ReleasedAt time.Time `json:"released_at"`
			ReleasedBy string    `json:"released_by"`
			Reason     string    `json:"reason"`
		} `json:"released"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &doc); err != nil || len(doc.Released) != 1 {
		t.Fatalf("release-hold --output json: %v, %s", err, r.stdout)
	}
	rel := doc.Released[0]
	host, _ := os.Hostname()
	if rel.ID != hold.ID || rel.Held != 200 || rel.Reason != "the exports really hang: upstream down" ||
		!strings.HasSuffix(rel.ReleasedBy, "@"+host) || time.Since(rel.ReleasedAt) > time.Minute {
		t.Fatalf("released %+v; want hold %d, 200 held, the reason, user@%s, now", rel, hold.ID, host)
	}
	if !strings.Contains(r.stderr, "stall-storm hold released") {
		t.Fatalf("release-hold logged no INFO line: %s", r.stderr)
	}
	r = run(t, "release-hold", "--reason", "again", "--database-url", db.URL, "--schema", db.Schema)
	requireExit(t, r, exitPassErrors)
	if !strings.Contains(r.stdout, "no stall-storm hold in effect for any queue") {
		t.Fatalf("second release-hold: %q", r.stdout)
	}

	code, sum = once(t, db, q)
	if code != exitOK || sum.Reaped != 200 || sum.StallStormHeld != 0 || len(sum.StallStormHolds) != 0 {
		t.Fatalf("first pass after the release: exit %d, %+v; want the 200 reaped at once, exit 0", code, sum)
	}
	if n := db.Count(t, `SELECT count(*) FROM jobs WHERE id = ANY($1) AND status = 'FAILED' AND failure_reason = 'stalled'`, ids); n != 200 {
		t.Fatalf("%d of 200 FAILED stalled", n)
	}
	if n := db.Count(t, `SELECT count(*) FROM reaper_holds WHERE released_at IS NOT NULL AND drained_at IS NOT NULL`); n != 1 {
		t.Fatal("the hold is not recorded as released and drained")
	}
}

// On run --once, --max-stalled-per-pass 0 on the command line lifts both
// limits: 30 jobs of 30 stalled (over the fraction) are reaped. A 0 from
// the file lifts only max_stalled_per_pass, so the fraction still holds
// them, and so does a --max-stalled-fraction given beside it. None lifts
// a hold already recorded.
func TestRunOnceMaxStalledPerPassZeroLiftsTheLimitsNotAHold(t *testing.T) {
	t.Parallel()
	db := jobstest.New(t)
	file := filepath.Join(t.TempDir(), "jobreaper.yaml")
	if err := os.WriteFile(file, []byte("max_stalled_per_pass: 0\n"), 0o600); err != nil {
		t.Fatal(err)
	}

	qa := unique("lift")
	stormJobs(t, db, qa, "report.export", 30)
	code, sum := once(t, db, qa, "--config", file)
	if code != exitPassErrors || sum.Reaped != 0 || sum.StallStormHeld != 30 || len(sum.StallStormHolds) != 1 ||
		!strings.Contains(sum.StallStormHolds[0].Tripped, "max_stalled_fraction 0.5") {
		t.Fatalf("max_stalled_per_pass 0 from the file: exit %d, %+v; want the 30 held by the fraction", code, sum)
	}
	// The hold recorded is honoured whatever the limits.
	code, sum = once(t, db, qa, "--max-stalled-per-pass", "0")
	if code != exitPassErrors || sum.Reaped != 0 || sum.StallStormHeld != 30 {
		t.Fatalf("--max-stalled-per-pass 0 under a hold: exit %d, %+v; want the 30 still held", code, sum)
	}

	qb := unique("lift")
	ids := stormJobs(t, db, qb, "report.export", 30)
	r := run(t, "run", "--once", "--output", "json", "--database-url", db.URL, "--schema", db.Schema,
		"--redis-url", redisTestURL(), "--queues", qb, "--max-stalled-per-pass", "0")
	requireExit(t, r, exitOK)
	if doc := requireOneJSONResult(t, r.stdout); string(doc["reaped"]) != "30" || string(doc["stall_storm_held"]) != "0" {
		t.Fatalf("--max-stalled-per-pass 0: %s, want the 30 reaped", r.stdout)
	}
	if !strings.Contains(r.stderr, "--max-stalled-per-pass 0: this pass reaps stalled jobs without the stall-storm limits") {
		t.Fatalf("no line says the limits are lifted: %s", r.stderr)
	}
	if n := db.Count(t, `SELECT count(*) FROM jobs WHERE id = ANY($1) AND status = $2`, ids, jobs.StatusFailed); n != 30 {
		t.Fatalf("%d of 30 FAILED", n)
	}

	// With --max-stalled-fraction on the same command line, that one
	// holds.
	qc := unique("lift")
	stormJobs(t, db, qc, "report.export", 30)
	code, sum = once(t, db, qc, "--max-stalled-per-pass", "0", "--max-stalled-fraction", "0.5")
	if code != exitPassErrors || sum.Reaped != 0 || sum.StallStormHeld != 30 {
		t.Fatalf("--max-stalled-per-pass 0 --max-stalled-fraction 0.5: exit %d, %+v; want the 30 held", code, sum)
	}
}

// A dry run of run --once reports the hold it would start and writes
// none; it exits 1 like the real pass would.
func TestRunOnceDryRunReportsTheHoldItWouldStart(t *testing.T) {
	t.Parallel()
	db := jobstest.New(t)
	q := unique("dryhold")
	stormJobs(t, db, q, "report.export", 150)
	code, sum := once(t, db, q, "--dry-run")
	if code != exitPassErrors || sum.Reaped != 0 || sum.StallStormHeld != 150 || len(sum.StallStormHolds) != 1 ||
		sum.StallStormHolds[0].ID != 0 || !sum.StallStormHolds[0].Started {
		t.Fatalf("dry run: exit %d, %+v; want exit 1 and the hold it would start (id 0)", code, sum)
	}
	if n := db.Count(t, `SELECT count(*) FROM reaper_holds`); n != 0 {
		t.Fatalf("the dry run recorded %d holds", n)
	}
}

// release-hold --help lists its own flags and says what it does and how it
// exits; it needs no Redis.
func TestReleaseHoldHelp(t *testing.T) {
	t.Parallel()
	r := run(t, "release-hold", "--help")
	requireExit(t, r, exitOK)
	for _, want := range []string{"--reason", "--queues", "--output", "--database-url", "--schema",
		"exits 0 when it released a hold, 1 when no hold was\nin effect", "contacts only PostgreSQL"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("release-hold --help lacks %q", want)
		}
	}
	for _, not := range []string{"--redis-url ", "--once ", "--stall-timeout "} {
		if strings.Contains(r.stdout, not) {
			t.Errorf("release-hold --help lists %s, which it does not use", not)
		}
	}
	r = run(t, "--help")
	if !strings.Contains(r.stdout, "release-hold") {
		t.Errorf("jobreaper --help does not list release-hold:\n%s", r.stdout)
	}
}
