package pgstore_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/jobreaper/jobreaper/internal/pgstore"
	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
)

// The status page's statements: RecordPass keeps one row per queue set,
// replaced by the next pass; RecentReaps reads the newest reaped events
// first, with their job's type and queue, and no other kind; WindowStats
// refuses a window that is not positive.
func TestStatusStatements(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := jobstest.New(t)
	s := db.Daemon()

	for i, sum := range []string{`{"reaped": 1}`, `{"reaped": 2}`} {
		if err := s.RecordPass(ctx, pgstore.PassRecord{Key: `["q"]`, HolderID: "h", HolderHost: "host", Summary: []byte(sum),
			AtRisk: []byte(`[{"job_id": "J"}]`)}); err != nil {
			t.Fatalf("pass %d: %v", i, err)
		}
	}
	if err := s.RecordPass(ctx, pgstore.PassRecord{Key: `[]`, HolderID: "h2", HolderHost: "host"}); err != nil {
		t.Fatal(err)
	}
	recs, err := s.PassRecords(ctx)
	if err != nil || len(recs) != 2 || recs[0].Key != `["q"]` || string(recs[0].Summary) != `{"reaped": 2}` ||
		string(recs[0].AtRisk) != `[{"job_id": "J"}]` || string(recs[1].Candidates) != `[]` || string(recs[1].Summary) != `{}` || recs[0].At.IsZero() {
		t.Fatalf("PassRecords = %+v, %v", recs, err)
	}

	sch := pgx.Identifier{db.Schema}.Sanitize()
	db.Exec(t, `INSERT INTO `+sch+`.jobs (id, type, status, queue) VALUES ('A', 'ta', 'FAILED', 'qa'), ('B', 'tb', 'FAILED', 'qb')`)
	db.Exec(t, `INSERT INTO `+sch+`.job_events (job_id, kind, generation, worker, at, detail) VALUES
 ('A', 'reaped', 3, 'w', now() - interval '2 minutes', '{"reason": "stalled", "idle_seconds": 700}'),
 ('B', 'reaped', 1, NULL, now() - interval '1 minute', '{"reason": "lost_task"}'),
 ('B', 'claimed', 2, 'w', now(), '{}'),
 ('GONE', 'reaped', 1, NULL, now() - interval '3 minutes', '{}')`)
	reaps, err := s.RecentReaps(ctx, 2)
	if err != nil || len(reaps) != 2 || reaps[0].JobID != "B" || reaps[0].Type != "tb" || reaps[0].Queue != "qb" ||
		reaps[1].JobID != "A" || reaps[1].Generation != 3 || reaps[1].Worker != "w" || string(reaps[1].Detail) != `{"reason": "stalled", "idle_seconds": 700}` {
		t.Fatalf("RecentReaps(2) = %+v, %v", reaps, err)
	}
	if reaps, err := s.RecentReaps(ctx, 100); err != nil || len(reaps) != 3 || reaps[2].JobID != "GONE" || reaps[2].Type != "" {
		t.Fatalf("RecentReaps(100) = %+v, %v; want the reap of a deleted job too, typeless", reaps, err)
	}

	if _, err := s.WindowStats(ctx, pgstore.WindowStatsParams{}); !errors.Is(err, jobs.ErrInvalidArgument) {
		t.Fatalf("WindowStats with no window = %v, want ErrInvalidArgument", err)
	}
}

// TestWindowStatsReadsEventsByKindAndTime checks, on EXPLAIN over a
// history of 60,000 events of which a few hundred are finished attempts
// and reaps of the last week, that suggest-limits reads job_events through
// job_events_kind_at_idx, never the whole table.
func TestWindowStatsReadsEventsByKindAndTime(t *testing.T) {
	t.Parallel()
	db := jobstest.New(t)
	s := db.Daemon()
	sch := pgx.Identifier{db.Schema}.Sanitize()
	db.Exec(t, `INSERT INTO `+sch+`.job_types (name, max_runtime) VALUES ('enc', '1 hour')`)
	db.Exec(t, `INSERT INTO `+sch+`.jobs (id, type, status) SELECT 'J' || i, 'enc', 'COMPLETED' FROM generate_series(1, 300) i`)
	db.Exec(t, `INSERT INTO `+sch+`.job_events (job_id, kind, at, detail)
SELECT 'J' || (i % 300 + 1), CASE WHEN i % 100 = 0 THEN 'completed' ELSE 'claimed' END,
       now() - (i || ' minutes')::interval, '{"runtime_seconds": 60, "max_idle_gap_seconds": 30}'
  FROM generate_series(1, 60000) i`)
	db.Exec(t, `ANALYZE `+sch+`.job_events`)
	db.Exec(t, `ANALYZE `+sch+`.jobs`)
	_, text := jobstest.Explain(t, db, s.Q(pgstore.WindowStatsSQL), pgx.NamedArgs{
		"window": "7 days", "type": "", "default_stall": "15 minutes", "default_hard": "24 hours"})
	if !strings.Contains(text, "job_events_kind_at_idx") || strings.Contains(text, "Seq Scan on job_events") {
		t.Fatalf("suggest-limits does not read job_events by kind and time:\n%s", text)
	}
	st, err := s.WindowStats(t.Context(), pgstore.WindowStatsParams{Window: 7 * 24 * time.Hour, DefaultStallTimeout: 15 * time.Minute,
		DefaultHardTimeout: 24 * time.Hour})
	// 10,080 minutes in a week: the completed events at i = 100, 200,
	// ..., 10,000.
	if err != nil || len(st) != 1 || st[0].Attempts != 100 || *st[0].Runtime.P99 != 60 {
		t.Fatalf("WindowStats = %+v, %v; want 100 attempts of 60 s", st, err)
	}
}
