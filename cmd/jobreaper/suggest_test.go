package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/jobreaper/jobreaper/internal/limits"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
)

// seedSuggest fills db with the window the suggest-limits tests read:
//
//   - type enc (max_runtime 1h, hard_timeout 30m): 100 finished attempts
//     (90 completed, 10 failed by their handler) with runtimes 10 s, 20 s,
//     ..., 1000 s and longest gaps 4 s, 8 s, ..., 400 s; two reaps, one
//     followed by the late Complete of its generation (reaped while
//     alive, idle 1200 s at the reap) and one followed by a late Fail and
//     a late Complete of another generation (not alive); an attempt
//     finished 8 days ago, outside the 7-day window;
//   - type thin: 99 finished attempts, not enough data;
//   - type idle: no event at all, and no stall timeout of its own.
func seedSuggest(t *testing.T, db *jobstest.DB) {
	t.Helper()
	s := pgx.Identifier{db.Schema}.Sanitize()
	db.JobType(t, "enc", "1 hour", "20 minutes", "30 minutes")
	db.JobType(t, "thin", "10 minutes", "", "")
	db.JobType(t, "idle", "10 minutes", "", "")
	db.Exec(t, `INSERT INTO `+s+`.jobs (id, type, status, generation)
SELECT 'E' || i, 'enc', 'COMPLETED', 1 FROM generate_series(1, 100) i
UNION ALL SELECT 'T' || i, 'thin', 'COMPLETED', 1 FROM generate_series(1, 99) i
UNION ALL SELECT id, 'enc', 'FAILED', 2 FROM unnest(ARRAY['RA', 'RB', 'OLD']) id`)
	db.Exec(t, `INSERT INTO `+s+`.job_events (job_id, kind, generation, at, detail)
SELECT 'E' || i, CASE WHEN i % 10 = 0 THEN 'failed' ELSE 'completed' END, 1, now() - interval '1 hour',
       jsonb_build_object('runtime_seconds', i * 10, 'max_idle_gap_seconds', i * 4)
  FROM generate_series(1, 100) i
UNION ALL
SELECT 'T' || i, 'completed', 1, now() - interval '1 hour', jsonb_build_object('runtime_seconds', 60, 'max_idle_gap_seconds', 30)
  FROM generate_series(1, 99) i
UNION ALL
SELECT 'OLD', 'completed', 1, now() - interval '8 days', '{"runtime_seconds": 99999, "max_idle_gap_seconds": 99999}'`)
	db.Exec(t, `INSERT INTO `+s+`.job_events (job_id, kind, generation, at, detail) VALUES
 ('RA', 'reaped', 2, now() - interval '50 minutes', '{"reason": "stalled", "runtime_seconds": 4000, "idle_seconds": 1200,
   "max_runtime_seconds": 3600, "stall_timeout_seconds": 900, "max_idle_gap_seconds": 1200}'),
 ('RA', 'late_result_rejected', 2, now() - interval '40 minutes', '{"operation": "Complete", "stale_generation": 2, "code": "job_terminal"}'),
 ('RB', 'reaped', 2, now() - interval '50 minutes', '{"reason": "stalled", "runtime_seconds": 3700, "idle_seconds": 1000,
   "max_runtime_seconds": 3600, "stall_timeout_seconds": 900, "max_idle_gap_seconds": 1000}'),
 ('RB', 'late_result_rejected', 2, now() - interval '40 minutes', '{"operation": "Fail", "stale_generation": 2, "code": "job_terminal"}'),
 ('RB', 'late_result_rejected', 1, now() - interval '40 minutes', '{"operation": "Complete", "stale_generation": 1, "code": "stale_worker"}')`)
}

func TestSuggestLimits(t *testing.T) {
	t.Parallel()
	db := jobstest.New(t)
	seedSuggest(t, db)
	suggest := func(t *testing.T, args ...string) result {
		return run(t, append([]string{"suggest-limits", "--database-url", jobstest.DatabaseURL(), "--schema", db.Schema}, args...)...)
	}

	t.Run("JSONHasTheExactValuesByTheirNames", func(t *testing.T) {
		t.Parallel()
		r := suggest(t, "--output", "json")
		requireExit(t, r, exitOK)
		// The names of the contract, read without our own types.
		var raw map[string]any
		if err := json.Unmarshal([]byte(r.stdout), &raw); err != nil {
			t.Fatalf("stdout is not one JSON document: %v\n%s", err, r.stdout)
		}
		if raw["window_seconds"] != float64(7*24*3600) {
			t.Fatalf("window_seconds = %v, want 604800", raw["window_seconds"])
		}
		first := raw["types"].([]any)[0].(map[string]any)
		for _, k := range []string{"type", "attempts", "reaps", "runtime_seconds", "max_idle_gap_seconds", "max_runtime_seconds",
			"stall_timeout_seconds", "suggested_max_runtime_seconds", "suggested_stall_timeout_seconds", "sql", "note"} {
			if _, ok := first[k]; !ok {
				t.Errorf("a type lacks the field %q: %v", k, first)
			}
		}
		for k, sub := range map[string][]string{"runtime_seconds": {"p50", "p95", "p99", "max"}, "max_idle_gap_seconds": {"p50", "p99", "max"}} {
			for _, f := range sub {
				if _, ok := first[k].(map[string]any)[f]; !ok {
					t.Errorf("%s lacks %q: %v", k, f, first[k])
				}
			}
		}

		var rep limits.Report
		if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil {
			t.Fatal(err)
		}
		if len(rep.Types) != 3 || rep.Types[0].Type != "enc" || rep.Types[1].Type != "idle" || rep.Types[2].Type != "thin" {
			t.Fatalf("types = %+v, want enc, idle, thin", rep.Types)
		}
		enc := rep.Types[0]
		// percentile_cont over 10, 20, ..., 1000: p50 at rank 49.5 = 505,
		// p95 at 94.05 = 950.5, p99 at 98.01 = 990.1.
		requireQ(t, "runtime p50", enc.RuntimeSeconds.P50, 505)
		requireQ(t, "runtime p95", enc.RuntimeSeconds.P95, 950.5)
		requireQ(t, "runtime p99", enc.RuntimeSeconds.P99, 990.1)
		requireQ(t, "runtime max", enc.RuntimeSeconds.Max, 1000)
		// Gaps 4, 8, ..., 400 and the 1200 s of the job reaped while
		// alive (101 values): p50 at rank 50 = 204, p99 at rank 99 = 400.
		requireQ(t, "gap p50", enc.MaxIdleGapSeconds.P50, 204)
		requireQ(t, "gap p99", enc.MaxIdleGapSeconds.P99, 400)
		requireQ(t, "gap max", enc.MaxIdleGapSeconds.Max, 1200)
		// Reap delays min(1200-900, 4000-3600) = 300 and min(100, 100) = 100.
		requireQ(t, "reap delay p50", enc.ReapDelaySeconds.P50, 200)
		requireQ(t, "reap delay max", enc.ReapDelaySeconds.Max, 300)
		if enc.Attempts != 100 || enc.Reaps != 2 || enc.ReapedWhileAlive != 1 {
			t.Fatalf("enc: %d attempts, %d reaps, %d alive; want 100, 2, 1", enc.Attempts, enc.Reaps, enc.ReapedWhileAlive)
		}
		if enc.MaxRuntimeSeconds != 3600 || enc.StallTimeoutSeconds != 1200 || enc.HardTimeoutSeconds != 1800 {
			t.Fatalf("enc limits %v/%v/%v, want 3600/1200/1800", enc.MaxRuntimeSeconds, enc.StallTimeoutSeconds, enc.HardTimeoutSeconds)
		}
		// max_runtime: 1.25 x 990.1 = 1237.6 -> 21m, but p99 + 5m
		// heartbeat = 1290.1 -> 22m. stall: 2 x 400 = 800 -> 14m (over
		// the 11m minimum). 22m + 14m reaches hard_timeout 30m:
		// hard_timeout 22m + 2 x 14m = 50m.
		requireQ(t, "suggested max_runtime", enc.SuggestedMaxRuntimeSeconds, 1320)
		requireQ(t, "suggested stall_timeout", enc.SuggestedStallTimeoutSeconds, 840)
		requireQ(t, "suggested hard_timeout", enc.SuggestedHardTimeoutSeconds, 3000)
		wantSQL := `UPDATE "` + db.Schema + `"."job_types" SET max_runtime = interval '22 minutes', stall_timeout = interval '14 minutes', hard_timeout = interval '50 minutes' WHERE name = 'enc';`
		if enc.SQL != wantSQL || !strings.Contains(enc.Note, "newly enqueued tasks only") {
			t.Fatalf("enc sql %q note %q\nwant sql %q", enc.SQL, enc.Note, wantSQL)
		}

		for _, tr := range rep.Types[1:] {
			if tr.SuggestedMaxRuntimeSeconds != nil || tr.SuggestedStallTimeoutSeconds != nil || tr.SQL != "" ||
				!strings.HasPrefix(tr.Note, "not enough data") {
				t.Fatalf("%s: %+v, want not enough data and no suggestion", tr.Type, tr)
			}
		}
		if thin := rep.Types[2]; thin.Attempts != 99 || thin.StallTimeoutSeconds != 900 {
			t.Fatalf("thin: %d attempts, stall %v; want 99 and the daemon default 900", thin.Attempts, thin.StallTimeoutSeconds)
		}
		if idle := rep.Types[1]; idle.Attempts != 0 || idle.RuntimeSeconds.P99 != nil {
			t.Fatalf("idle: %+v, want no attempts and no percentile", idle)
		}
	})

	t.Run("TypeAndWindowSelect", func(t *testing.T) {
		t.Parallel()
		r := suggest(t, "--type", "enc", "--window", "30m", "--output", "json")
		requireExit(t, r, exitOK)
		var rep limits.Report
		if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil {
			t.Fatal(err)
		}
		// Everything was recorded 40 minutes ago or earlier.
		if rep.WindowSeconds != 1800 || len(rep.Types) != 1 || rep.Types[0].Attempts != 0 || rep.Types[0].Reaps != 0 {
			t.Fatalf("--type enc --window 30m: %s", r.stdout)
		}
		r = suggest(t, "--type", "enc", "--window", "9d", "--output", "json")
		if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil {
			t.Fatal(err)
		}
		if rep.Types[0].Attempts != 101 {
			t.Fatalf("--window 9d: %d attempts, want 101 (the 8-day-old one too)", rep.Types[0].Attempts)
		}
	})

	t.Run("TextSaysWhatToRun", func(t *testing.T) {
		t.Parallel()
		r := suggest(t)
		requireExit(t, r, exitOK)
		for _, want := range []string{"type enc: 100 finished attempt(s), 2 reap(s), 1 reaped while alive",
			"p99 16m30.1s", "interval '22 minutes'", "type thin: 99 finished", "not enough data"} {
			if !strings.Contains(r.stdout, want) {
				t.Errorf("text output lacks %q:\n%s", want, r.stdout)
			}
		}
	})

	t.Run("BadFlagsExit2", func(t *testing.T) {
		t.Parallel()
		for _, args := range [][]string{{"--window", "soon"}, {"--window", "0s"}, {"--output", "yaml"}, {"--type", "nope"}} {
			r := suggest(t, args...)
			requireExit(t, r, exitCannotRun)
		}
	})
}

func requireQ(t *testing.T, what string, got *float64, want float64) {
	t.Helper()
	if got == nil || *got < want-1e-9 || *got > want+1e-9 {
		if got == nil {
			t.Fatalf("%s = null, want %v", what, want)
		}
		t.Fatalf("%s = %v, want %v", what, *got, want)
	}
}
