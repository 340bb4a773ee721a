package pgstore_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/jobreaper/jobreaper/internal/pgstore"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
)

// The statements that record marker writes change several job rows at
// once, as a reap does. They must lock those rows in ID order, the order
// ReapBatch locks its batch in: a statement that locked B before A while a
// reap held A and waited for B would close a cycle that PostgreSQL breaks
// by failing one of them (and a start guard queued behind them on A with
// it). The rows are inserted B first, so the heap order a bitmap scan
// returns them in is the opposite of the ID order; a transaction holds A
// (a new attempt claiming it: generation 2); while the statement waits
// for A, B must still be free. Once the claim commits, the statement
// re-reads A under its lock and leaves it alone: its marker is not the
// one of A's current generation.
func TestMarkerStatementsLockRowsInIDOrder(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		markerSet bool // marker_set_at before the statement
		run       func(*testStore, []pgstore.MarkerRef) error
	}{
		{"MarkMarkersSet", false, func(s *testStore, refs []pgstore.MarkerRef) error {
			return s.MarkMarkersSet(context.Background(), refs)
		}},
		{"MarkMarkersFailed", true, func(s *testStore, refs []pgstore.MarkerRef) error {
			return s.MarkMarkersFailed(context.Background(), refs)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db := jobstest.New(t)
			db.JobType(t, "report.export", "1 hour", "", "")
			store := stores(db, nil)
			marker := "NULL"
			if tc.markerSet {
				marker = "now()"
			}
			db.Exec(t, `INSERT INTO jobs (id, type, status, generation, failure_reason, finished_at, marker_set_at)
VALUES ('B', 'report.export', 'FAILED', 1, 'stalled', now(), `+marker+`),
       ('A', 'report.export', 'FAILED', 1, 'stalled', now(), `+marker+`)`)

			holder, pid := conn(t, db)
			for _, sql := range []string{`BEGIN`, `UPDATE jobs SET generation = 2, status = 'PROCESSING' WHERE id = 'A'`} {
				if _, err := holder.Exec(ctx, sql); err != nil {
					t.Fatal(err)
				}
			}
			done := make(chan error, 1)
			go func() {
				done <- tc.run(store, []pgstore.MarkerRef{{JobID: "A", Generation: 1}, {JobID: "B", Generation: 1}})
			}()
			jobstest.Eventually(t, "the statement waits for A's lock", func() bool {
				return db.Count(t, `SELECT count(*) FROM pg_stat_activity
 WHERE wait_event_type = 'Lock' AND pid <> $1 AND position($2 in query) > 0`, pid, db.Schema) == 1
			})
			_, err := db.Pool.Exec(ctx, `SELECT id FROM `+db.Table("jobs")+` WHERE id = 'B' FOR UPDATE NOWAIT`)
			var pgErr *pgconn.PgError
			if errors.As(err, &pgErr) && pgErr.Code == "55P03" {
				t.Fatalf("%s locked B while it waited for A: rows are locked out of ID order", tc.name)
			}
			if err != nil {
				t.Fatal(err)
			}
			if _, err := holder.Exec(ctx, `COMMIT`); err != nil {
				t.Fatal(err)
			}
			if err := <-done; err != nil {
				t.Fatalf("%s: %v", tc.name, err)
			}
			// B changed; A, claimed meanwhile, kept what it had.
			requireCount(t, db, 1, `SELECT count(*) FROM jobs WHERE id = 'B' AND (marker_set_at IS NOT NULL) <> $1`, tc.markerSet)
			requireCount(t, db, 1, `SELECT count(*) FROM jobs WHERE id = 'A' AND generation = 2 AND (marker_set_at IS NOT NULL) = $1`, tc.markerSet)
		})
	}
}
