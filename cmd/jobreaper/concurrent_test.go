package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/jobreaper/jobreaper/internal/fleettest"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
	"github.com/jobreaper/jobreaper/queue"
	"github.com/jobreaper/jobreaper/queue/queuetest"
	"github.com/jobreaper/jobreaper/reaper"
)

// Four reaper processes (the real binary, one per worker pod) run at once
// on 2,000 stalled jobs whose on_failed cascade counts failed children on
// 50 parents. Every job becomes FAILED exactly once: 2,000 transitions
// reported across the processes' summaries, 2,000 reaped events, each
// parent counted once per child. A deadlock, should one occur, is an error
// of its pass and its batch is reaped by a later pass: the outcome is
// asserted, not the absence of retries.
func TestConcurrentReaperProcessesReapEachJobOnce(t *testing.T) {
	t.Parallel()
	const jobsN, parentsN, processes = 2000, 50, 4
	ctx := context.Background()
	bin := fleettest.BuildJobreaperRelease(t)
	db := jobstest.New(t)
	rdb := realRedis(t)
	q := unique("concurrent")
	db.JobType(t, "report.export", "30 minutes", "", "")
	parents := pgx.Identifier{db.Schema, "parents"}.Sanitize()
	db.Exec(t, `CREATE TABLE `+parents+` (id text PRIMARY KEY, failed int NOT NULL DEFAULT 0)`)
	db.Exec(t, `INSERT INTO `+parents+` (id) SELECT 'P' || i FROM generate_series(0, $1 - 1) AS i`, parentsN)
	db.Exec(t, `INSERT INTO jobs (id, type, status, generation, worker, queue, parent_id, started_at, updated_at)
SELECT $1 || '-' || lpad(i::text, 5, '0'), 'report.export', 'PROCESSING', 1, 'w1', $1, 'P' || (i % $2),
       now() - interval '31 minutes', now() - interval '21 minutes'
  FROM generate_series(1, $3) AS i`, q, parentsN, jobsN)
	ids := make([]string, jobsN)
	for i := range ids {
		ids[i] = fmt.Sprintf("%s-%05d", q, i+1)
	}
	t.Cleanup(func() {
		_ = queuetest.Remove(context.Background(), rdb, q)
		for start := 0; start < len(ids); start += 500 {
			keys := make([]string, 0, 500)
			for _, id := range ids[start:min(start+500, len(ids))] {
				keys = append(keys, queue.MarkerKey(id))
			}
			rdb.Del(context.Background(), keys...)
		}
	})
	if err := queuetest.MakeActive(ctx, rdb, q, "report.export", ids); err != nil {
		t.Fatal(err)
	}
	config := filepath.Join(t.TempDir(), "jobreaper.yaml")
	// The 2,000 jobs stall together on purpose: the stall-storm limits are
	// off, as the test is about concurrent reapers, not about storms.
	yaml := fmt.Sprintf("max_stalled_per_pass: 0\nmax_stalled_fraction: 0\ncascades:\n  report.export:\n    on_failed:\n      - 'UPDATE %s SET failed = failed + 1 WHERE id = @parent_id'\n", parents)
	if err := os.WriteFile(config, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}

	reported, errorsSeen := 0, 0
	for round := 1; round <= 5 && db.Count(t, `SELECT count(*) FROM jobs WHERE status = 'PROCESSING'`) > 0; round++ {
		var wg sync.WaitGroup
		var mu sync.Mutex
		for p := range processes {
			wg.Add(1)
			go func() {
				defer wg.Done()
				cmd := exec.CommandContext(ctx, bin, "run", "--once", "--output", "json", "--config", config,
					"--database-url", db.URL, "--schema", db.Schema, "--redis-url", redisTestURL(), "--queues", q,
					"--log-level", "warn")
				var stdout, stderr bytes.Buffer
				cmd.Stdout, cmd.Stderr = &stdout, &stderr
				err := cmd.Run()
				var sum reaper.Result
				jerr := json.Unmarshal(stdout.Bytes(), &sum)
				mu.Lock()
				defer mu.Unlock()
				// Exit 1 for errors, or for marker writes held: no asynq
				// server is live here, and another process's reaps may
				// not have their markers yet when this one re-asserts.
				if code := cmd.ProcessState.ExitCode(); jerr != nil || code > 1 || (code == 1) != (sum.Errors > 0 || sum.MarkersHeld > 0) {
					t.Errorf("round %d process %d: exit %d (%v), summary %q (%v)\n%s", round, p, code, err, stdout.String(), jerr, stderr.String())
					return
				}
				if cerr := sum.CheckScanned(); cerr != nil || strings.Contains(stderr.String(), reaper.ScannedMismatchLog) {
					t.Errorf("round %d process %d: %v\n%s", round, p, cerr, stderr.String())
				}
				if sum.Errors > 0 {
					t.Logf("round %d process %d counted %d errors (retried by the next pass):\n%s", round, p, sum.Errors, stderr.String())
				}
				reported += sum.Reaped
				errorsSeen += sum.Errors
			}()
		}
		wg.Wait()
	}
	t.Logf("%d reaps reported, %d pass errors", reported, errorsSeen)
	if reported != jobsN {
		t.Errorf("the processes reported %d reaps, want exactly %d (each FAILED transition once)", reported, jobsN)
	}
	if n := db.Count(t, `SELECT count(*) FROM jobs WHERE status = 'FAILED' AND failure_reason = 'stalled' AND generation = 1`); n != jobsN {
		t.Errorf("%d jobs FAILED stalled, want %d", n, jobsN)
	}
	if n := db.Count(t, `SELECT count(*) FROM job_events WHERE kind = 'reaped'`); n != jobsN {
		t.Errorf("%d reaped events, want %d", n, jobsN)
	}
	if n := db.Count(t, `SELECT count(*) FROM (SELECT job_id FROM job_events WHERE kind = 'reaped' GROUP BY job_id HAVING count(*) > 1) AS twice`); n != 0 {
		t.Errorf("%d jobs have more than one reaped event", n)
	}
	perParent := int64(jobsN / parentsN)
	if n := db.Count(t, `SELECT count(*) FROM `+parents+` WHERE failed <> $1`, perParent); n != 0 {
		t.Errorf("%d parents were not counted exactly %d times: a cascade ran twice or not at all", n, perParent)
	}
	markers := 0
	for start := 0; start < len(ids); start += 500 {
		keys := make([]string, 0, 500)
		for _, id := range ids[start:min(start+500, len(ids))] {
			keys = append(keys, queue.MarkerKey(id))
		}
		n, err := rdb.Exists(ctx, keys...).Result()
		if err != nil {
			t.Fatal(err)
		}
		markers += int(n)
	}
	if markers != jobsN {
		t.Errorf("%d markers, want %d", markers, jobsN)
	}
}
