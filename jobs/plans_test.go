package jobs_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
)

// planNode is the part of EXPLAIN (FORMAT JSON) a plan check reads.
type planNode struct {
	NodeType     string     `json:"Node Type"`
	RelationName string     `json:"Relation Name"`
	IndexName    string     `json:"Index Name"`
	Plans        []planNode `json:"Plans"`
}

// explain returns the plan PostgreSQL makes for sql with args as the
// Store runs it (behind the settings of jobs.PinPlansSQL, in one
// transaction), and the plan's outline for failure messages.
func explain(t *testing.T, db *jobstest.DB, sql string, args ...any) (planNode, string) {
	t.Helper()
	ctx := context.Background()
	tx, err := db.Pool.Begin(ctx)
	requireNoErr(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, jobs.PinPlansSQL)
	requireNoErr(t, err)
	var raw []byte
	requireNoErr(t, tx.QueryRow(ctx, "EXPLAIN (FORMAT JSON) "+sql, args...).Scan(&raw))
	var doc []struct {
		Plan planNode `json:"Plan"`
	}
	requireNoErr(t, json.Unmarshal(raw, &doc))
	var text strings.Builder
	rows, err := tx.Query(ctx, "EXPLAIN "+sql, args...)
	requireNoErr(t, err)
	for rows.Next() {
		var line string
		requireNoErr(t, rows.Scan(&line))
		// Filter and condition lines repeat the whole ID array.
		if trimmed := strings.TrimSpace(line); strings.Contains(trimmed, ": ") && !strings.HasPrefix(trimmed, "->") {
			continue
		}
		text.WriteString(line + "\n")
	}
	requireNoErr(t, rows.Err())
	return doc[0].Plan, text.String()
}

// jobsAccess lists how a plan reads the jobs table: "Seq Scan", or the
// index names of its index and bitmap scans, and whether it has a Gather
// or a nested loop (which would rescan a batch's array once per row).
func jobsAccess(n planNode, out *[]string, gather *bool) {
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
		jobsAccess(c, out, gather)
	}
}

// staleTable fills db's jobs table the way a production table goes stale:
// autovacuum off, analyzed, then thousands of rows failed since (the
// planner's statistics say no row is FAILED). With analyzedEmpty the only
// ANALYZE ran on the empty table, which makes every partial index look
// empty forever.
func staleTable(t *testing.T, db *jobstest.DB, analyzedEmpty bool) {
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

// TestPlansHoldOnStaleStatistics checks, on EXPLAIN and not on time, that
// every statement of the reaper that names jobs by ID reads jobs through
// the primary key alone, and that the lost-task search goes through the
// partial index of PROCESSING rows without a parallel plan, however stale
// the statistics.
func TestPlansHoldOnStaleStatistics(t *testing.T) {
	t.Parallel()
	for _, analyzedEmpty := range []bool{false, true} {
		t.Run(fmt.Sprintf("AnalyzedEmpty=%v", analyzedEmpty), func(t *testing.T) {
			t.Parallel()
			db, store := setup(t, nil)
			staleTable(t, db, analyzedEmpty)
			ids := func(prefix string, from, n int) []string {
				out := make([]string, n)
				for i := range out {
					out[i] = fmt.Sprintf("%s%06d", prefix, from+i)
				}
				return out
			}
			gens := func(n int) []int64 { return slices.Repeat([]int64{1}, n) }
			times := func(n int) []time.Time { return slices.Repeat([]time.Time{time.Now()}, n) }
			reapArgs := func(idList []string) pgx.NamedArgs {
				a := pgx.NamedArgs(rule.Args())
				a["ids"], a["generations"], a["updated_ats"], a["reason"] = idList, gens(len(idList)), times(len(idList)), "stalled"
				return a
			}
			byID := []struct {
				name string
				sql  string
				args pgx.NamedArgs
			}{
				{"LoadOfTenThousand", jobs.LoadSQL, pgx.NamedArgs{"ids": ids("p", 5001, 10000)}},
				{"LoadOfOne", jobs.LoadSQL, pgx.NamedArgs{"ids": ids("p", 7, 1)}},
				{"ReapOfAThousand", jobs.ReapBatchSQL, reapArgs(ids("p", 6001, 1000))},
				{"ReapOfOne", jobs.ReapBatchSQL, reapArgs(ids("p", 6001, 1))},
				{"ReapLockOfAThousand", jobs.ReapLockSQL, pgx.NamedArgs{"ids": ids("p", 6001, 1000)}},
				{"MarkersOfAThousandFailedRows", jobs.MarkersSetSQL, pgx.NamedArgs{"ids": ids("p", 1, 1000), "generations": gens(1000)}},
				{"MarkerOfOneFailedRow", jobs.MarkersSetSQL, pgx.NamedArgs{"ids": ids("p", 5, 1), "generations": gens(1)}},
				{"FailedMarkersOfAThousandRows", jobs.MarkersFailedSQL, pgx.NamedArgs{"ids": ids("p", 1, 1000), "generations": gens(1000)}},
				{"StateOfOne", jobs.ReadStateSQL, nil},
			}
			for _, st := range byID {
				args := []any{st.args}
				if st.args == nil {
					args = []any{"p000005"}
				}
				plan, text := explain(t, db, store.Q(st.sql), args...)
				var access []string
				var gather bool
				jobsAccess(plan, &access, &gather)
				if len(access) == 0 || slices.ContainsFunc(access, func(a string) bool { return a != "jobs_pkey" }) || gather {
					t.Errorf("%s reads jobs by %v (gather or nested loop %v), want the primary key only, joined by hash:\n%s", st.name, access, gather, text)
				}
			}

			lostArgs := pgx.NamedArgs(rule.Args())
			lostArgs["queues"] = []string{"q0", "q1", "q2", "q3", "q4", "q5", "q6", "q7", "q8", "q9"}
			lostArgs["limit"] = jobs.LostCandidatesLimitDefault
			lostArgs["after_updated_at"] = pgtype.Timestamptz{InfinityModifier: pgtype.NegativeInfinity, Valid: true}
			lostArgs["after_id"] = ""
			plan, text := explain(t, db, store.Q(jobs.LostCandidatesSQL), lostArgs)
			var access []string
			var gather bool
			jobsAccess(plan, &access, &gather)
			if !slices.Equal(access, []string{"jobs_processing_queue_idx"}) || gather {
				t.Errorf("the lost-task search reads jobs by %v (gather or nested loop %v), want jobs_processing_queue_idx only:\n%s", access, gather, text)
			}
		})
	}
}
