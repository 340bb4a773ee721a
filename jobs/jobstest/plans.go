package jobstest

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/jobreaper/jobreaper/internal/pgcore"
)

// The plan checks: a statement's plan read from EXPLAIN on a table whose
// statistics went stale the way production tables do, for the tests that
// hold each hot statement to the index it must use.

// PlanNode is the part of EXPLAIN (FORMAT JSON) a plan check reads.
type PlanNode struct {
	NodeType     string     `json:"Node Type"`
	RelationName string     `json:"Relation Name"`
	IndexName    string     `json:"Index Name"`
	Plans        []PlanNode `json:"Plans"`
}

// Explain returns the plan PostgreSQL makes for sql with args as the
// daemon's statements that name jobs by an array run (behind the settings
// of pgcore.PinPlansSQL, in one transaction), and the plan's outline for
// failure messages.
func Explain(t testing.TB, db *DB, sql string, args ...any) (PlanNode, string) {
	t.Helper()
	ctx := context.Background()
	tx, err := db.Pool.Begin(ctx)
	noErr(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, pgcore.PinPlansSQL)
	noErr(t, err)
	var raw []byte
	noErr(t, tx.QueryRow(ctx, "EXPLAIN (FORMAT JSON) "+sql, args...).Scan(&raw))
	var doc []struct {
		Plan PlanNode `json:"Plan"`
	}
	noErr(t, json.Unmarshal(raw, &doc))
	var text strings.Builder
	rows, err := tx.Query(ctx, "EXPLAIN "+sql, args...)
	noErr(t, err)
	for rows.Next() {
		var line string
		noErr(t, rows.Scan(&line))
		// Filter and condition lines repeat the whole ID array.
		if trimmed := strings.TrimSpace(line); strings.Contains(trimmed, ": ") && !strings.HasPrefix(trimmed, "->") {
			continue
		}
		text.WriteString(line + "\n")
	}
	noErr(t, rows.Err())
	return doc[0].Plan, text.String()
}

// JobsAccess lists how a plan reads the jobs table: "Seq Scan", or the
// index names of its index and bitmap scans, and whether it has a Gather
// or a nested loop (which would rescan a batch's array once per row).
func JobsAccess(n PlanNode, out *[]string, gather *bool) {
	switch {
	case n.NodeType == "Gather" || n.NodeType == "Gather Merge" || n.NodeType == "Nested Loop":
		*gather = true
	case n.RelationName == "jobs" && n.NodeType == "Seq Scan":
		*out = append(*out, "Seq Scan")
	case n.RelationName == "jobs" && n.IndexName != "":
		*out = append(*out, n.IndexName)
	case n.NodeType == "Bitmap Index Scan" && strings.HasPrefix(n.IndexName, "jobs_"):
		*out = append(*out, n.IndexName)
	}
	for _, c := range n.Plans {
		JobsAccess(c, out, gather)
	}
}

// StaleTable fills db's jobs table the way a production table goes stale:
// autovacuum off, analyzed, then thousands of rows failed since (the
// planner's statistics say no row is FAILED). With analyzedEmpty the only
// ANALYZE ran on the empty table, which makes every partial index look
// empty forever.
func StaleTable(t testing.TB, db *DB, analyzedEmpty bool) {
	t.Helper()
	db.Exec(t, `ALTER TABLE jobs SET (autovacuum_enabled = false)`)
	db.Exec(t, `ALTER TABLE job_events SET (autovacuum_enabled = false)`)
	if analyzedEmpty {
		db.Exec(t, `ANALYZE jobs`)
	}
	db.Exec(t, `INSERT INTO jobs (id, type, status, generation, queue, started_at, updated_at)
SELECT 'p' || lpad(i::text, 6, '0'), 'report.export', 'PROCESSING', 1, 'q' || (i % 10),
       now() - interval '1 hour', now() - CASE WHEN i % 20 = 0 THEN interval '30 minutes' ELSE interval '1 minute' END
  FROM generate_series(1, 20000) AS i`)
	db.Exec(t, `INSERT INTO jobs (id, type, status, generation, queue, started_at, updated_at, finished_at)
SELECT 'c' || lpad(i::text, 6, '0'), 'report.export', 'COMPLETED', 1, 'q' || (i % 10),
       now() - interval '3 hours', now() - interval '2 hours', now() - interval '2 hours'
  FROM generate_series(1, 60000) AS i`)
	if !analyzedEmpty {
		db.Exec(t, `ANALYZE jobs`)
	}
	db.Exec(t, `UPDATE jobs SET status = 'FAILED', failure_reason = 'stalled', finished_at = now()
 WHERE id < 'p005001'`)
}

// ExplainPlain returns the plan of sql as the worker library runs it: a
// single statement, with no plan settings around it.
func ExplainPlain(t testing.TB, db *DB, sql string, args ...any) PlanNode {
	t.Helper()
	var raw []byte
	noErr(t, db.Pool.QueryRow(context.Background(), "EXPLAIN (FORMAT JSON) "+sql, args...).Scan(&raw))
	var doc []struct {
		Plan PlanNode `json:"Plan"`
	}
	noErr(t, json.Unmarshal(raw, &doc))
	return doc[0].Plan
}

// noErr fails the test on err.
func noErr(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
