package pgstore_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jobreaper/jobreaper/internal/pgstore"
	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
)

// readCandidates reads ids as the reaper does and returns their
// candidates.
func readCandidates(t *testing.T, store *testStore, ids ...string) []pgstore.ReapCandidate {
	t.Helper()
	snaps, err := store.LoadForTasks(context.Background(), ids)
	requireNoErr(t, err)
	var out []pgstore.ReapCandidate
	for _, id := range ids {
		sn, ok := snaps[id]
		if !ok {
			t.Fatalf("job %s was not loaded", id)
		}
		out = append(out, pgstore.ReapCandidate{JobID: id, Generation: sn.Generation, UpdatedAt: sn.UpdatedAt})
	}
	return out
}

func TestReapBatch(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("RowsThatChangedSinceTheReadAreExactlyTheChangedOnes", func(t *testing.T) {
		t.Parallel()
		db, _ := setup(t, nil)
		db.Exec(t, `CREATE TABLE parents (id text PRIMARY KEY, failed int NOT NULL DEFAULT 0)`)
		db.Exec(t, `CREATE TABLE cascade_log (n bigserial PRIMARY KEY, job_id text NOT NULL)`)
		db.Exec(t, `INSERT INTO parents (id) VALUES ('P1'), ('P2')`)
		db.JobType(t, "slow.type", "30 minutes", "", "")
		cascade := jobs.Cascade{OnFailed: []string{
			`UPDATE parents SET failed = failed + 1 WHERE id = @parent_id`,
			`INSERT INTO cascade_log (job_id) VALUES (@job_id)`,
		}}
		store := stores(db, jobs.Cascades{"report.export": cascade, "slow.type": cascade})
		ids := []string{"J01", "J02", "J03", "J04", "J05", "J06", "J07", "J08"}
		for _, id := range ids {
			typ, parent := "report.export", "P1"
			if id == "J08" {
				typ = "slow.type"
			}
			if id == "J02" || id == "J04" {
				parent = "P2"
			}
			db.Insert(t, jobstest.Job{ID: id, Type: typ, Generation: 1, Worker: "w1", ParentID: parent,
				StartedAgo: jobstest.Ago(31 * time.Minute), IdleAgo: 21 * time.Minute})
		}
		// Read in one order, handed over in another: the reap sorts.
		cands := readCandidates(t, store, ids...)
		slices.Reverse(cands)
		// Between the read and the write:
		db.Exec(t, `UPDATE jobs SET updated_at = now() WHERE id = 'J02'`)                                     // progressed
		db.Exec(t, `UPDATE jobs SET generation = 2, started_at = now(), updated_at = now() WHERE id = 'J04'`) // reclaimed
		db.Exec(t, `UPDATE jobs SET status = 'COMPLETED', finished_at = now() WHERE id = 'J06'`)              // completed
		db.Exec(t, `UPDATE job_types SET max_runtime = '2 hours' WHERE name = 'slow.type'`)                   // limit raised

		res, err := store.ReapBatch(ctx, pgstore.ReapBatchParams{Candidates: cands, Reason: jobs.ReasonStalled, Rule: rule})
		requireNoErr(t, err)
		var reaped []string
		for _, r := range res.Reaped {
			reaped = append(reaped, r.JobID)
			if r.Evidence.Generation != 1 || r.Evidence.Worker != "w1" || r.Evidence.MaxRuntime != 30*time.Minute || r.Evidence.Reason != jobs.ReasonStalled {
				t.Errorf("evidence of %s = %+v", r.JobID, r.Evidence)
			}
		}
		if want := []string{"J01", "J03", "J05", "J07"}; !slices.Equal(reaped, want) {
			t.Fatalf("reaped %v, want %v", reaped, want)
		}
		if want := []string{"J02", "J04", "J06", "J08"}; !slices.Equal(res.Changed, want) || len(res.Failed) != 0 {
			t.Fatalf("changed since read %v (failed %v), want %v", res.Changed, res.Failed, want)
		}
		for _, id := range reaped {
			if row := db.Read(t, id); row.Status != jobs.StatusFailed || row.FailureReason != jobs.ReasonStalled {
				t.Fatalf("%s = %+v, want FAILED stalled", id, row)
			}
			requireCount(t, db, 1, `SELECT count(*) FROM job_events WHERE job_id = $1 AND kind = 'reaped'`, id)
		}
		requireRow(t, db, "J02", jobs.StatusProcessing, 1, 0)
		requireRow(t, db, "J04", jobs.StatusProcessing, 2, 0)
		requireRow(t, db, "J06", jobs.StatusCompleted, 1, 0)
		requireRow(t, db, "J08", jobs.StatusProcessing, 1, 0)
		requireCount(t, db, 4, `SELECT count(*) FROM job_events WHERE kind = 'reaped'`)
		// Four children of P1 reaped: P1 changed four times; P2's children
		// both changed since the read: P2 untouched.
		requireCount(t, db, 4, `SELECT failed FROM parents WHERE id = 'P1'`)
		requireCount(t, db, 0, `SELECT failed FROM parents WHERE id = 'P2'`)
		rows, err := db.Pool.Query(ctx, `SELECT job_id FROM cascade_log ORDER BY n`)
		requireNoErr(t, err)
		var order []string
		for rows.Next() {
			var id string
			requireNoErr(t, rows.Scan(&id))
			order = append(order, id)
		}
		if !slices.Equal(order, reaped) {
			t.Fatalf("cascades ran for %v, want once per reaped row in ID order %v", order, reaped)
		}
	})

	t.Run("ARowWhoseCascadeFailsIsSetAsideAndTheOthersAreReaped", func(t *testing.T) {
		t.Parallel()
		db, _ := setup(t, nil)
		db.Exec(t, `CREATE TABLE audit (job_id text NOT NULL, parent_id text NOT NULL)`)
		store := stores(db, jobs.Cascades{"report.export": {OnFailed: []string{
			`INSERT INTO audit (job_id, parent_id) VALUES (@job_id, @parent_id)`,
		}}})
		for _, id := range []string{"A1", "A2", "A3"} {
			parent := "P"
			if id == "A2" {
				parent = "" // NULL: the cascade's NOT NULL refuses it
			}
			db.Insert(t, jobstest.Job{ID: id, Type: "report.export", Generation: 1, ParentID: parent,
				StartedAgo: jobstest.Ago(31 * time.Minute), IdleAgo: 21 * time.Minute})
		}
		res, err := store.ReapBatch(ctx, pgstore.ReapBatchParams{Candidates: readCandidates(t, store, "A1", "A2", "A3"),
			Reason: jobs.ReasonStalled, Rule: rule})
		requireNoErr(t, err)
		if len(res.Reaped) != 2 || res.Reaped[0].JobID != "A1" || res.Reaped[1].JobID != "A3" {
			t.Fatalf("reaped %+v, want A1 and A3", res.Reaped)
		}
		if len(res.Failed) != 1 || res.Failed[0].JobID != "A2" || !strings.Contains(res.Failed[0].Err.Error(), `cascade on_failed of type "report.export", statement 1`) {
			t.Fatalf("failed = %+v, want A2 naming its cascade statement", res.Failed)
		}
		requireRow(t, db, "A2", jobs.StatusProcessing, 1, 0)
		requireCount(t, db, 0, `SELECT count(*) FROM job_events WHERE job_id = 'A2'`)
		requireCount(t, db, 2, `SELECT count(*) FROM audit`)
	})

	t.Run("MoreThanABatchIsRefused", func(t *testing.T) {
		t.Parallel()
		_, store := setup(t, nil)
		cands := make([]pgstore.ReapCandidate, pgstore.ReapBatchSize+1)
		for i := range cands {
			cands[i].JobID = fmt.Sprintf("J%d", i)
		}
		_, err := store.ReapBatch(ctx, pgstore.ReapBatchParams{Candidates: cands, Reason: jobs.ReasonStalled, Rule: rule})
		requireIs(t, err, jobs.ErrInvalidArgument)
	})
}

// The reaped event's evidence converts intervals the way the stall rule
// compares them (30-day months, 24-hour days): extract(epoch) would count
// '1 year' as 365.25 days, and the evidence would then say a job 361 days
// into a one-year limit had not exceeded it.
func TestReapEvidenceConvertsIntervalsAsTheRuleComparesThem(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, store := setup(t, nil)
	db.JobType(t, "yearly.audit", "1 year", "", "2 years")
	db.JobType(t, "monthly.close", "1 mon", "1 mon", "1 year")
	const day = 24 * time.Hour
	db.Insert(t, jobstest.Job{ID: "Y", Type: "yearly.audit", Generation: 1,
		StartedAgo: jobstest.Ago(361 * day), IdleAgo: 21 * time.Minute})
	db.Insert(t, jobstest.Job{ID: "M", Type: "monthly.close", Generation: 1,
		StartedAgo: jobstest.Ago(61 * day), IdleAgo: 31 * day})
	res, err := store.ReapBatch(ctx, pgstore.ReapBatchParams{Candidates: readCandidates(t, store, "Y", "M"),
		Reason: jobs.ReasonStalled, Rule: rule})
	requireNoErr(t, err)
	if len(res.Reaped) != 2 {
		t.Fatalf("reaped %+v, want Y and M (360 and 30 days are past)", res)
	}
	for _, tc := range []struct {
		id                         string
		maxRuntime, stall, runtime float64
	}{
		{"Y", 360 * 86400, 15 * 60, 361 * 86400},
		{"M", 30 * 86400, 30 * 86400, 61 * 86400},
	} {
		var maxRuntime, stall, runtime float64
		err := db.Pool.QueryRow(ctx, `SELECT (detail->>'max_runtime_seconds')::float8, (detail->>'stall_timeout_seconds')::float8,
       (detail->>'runtime_seconds')::float8
  FROM job_events WHERE job_id = $1 AND kind = 'reaped'`, tc.id).Scan(&maxRuntime, &stall, &runtime)
		requireNoErr(t, err)
		if maxRuntime != tc.maxRuntime || stall != tc.stall || runtime < tc.runtime || runtime > tc.runtime+60 || runtime <= maxRuntime {
			t.Fatalf("%s evidence: max_runtime_seconds %v stall_timeout_seconds %v runtime_seconds %v; want %v, %v and about %v",
				tc.id, maxRuntime, stall, runtime, tc.maxRuntime, tc.stall, tc.runtime)
		}
	}
}

// A reap's cascade statements are rewritten to positional arguments once
// per batch; each row still gets its own values in the places its
// statement names them, a name used twice included, and NULL for an empty
// parent or tenant.
func TestReapBatchCascadeArgumentsPerRow(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, _ := setup(t, nil)
	db.Exec(t, `CREATE TABLE audit4 (a text, b text, c text, d text, e text)`)
	store := stores(db, jobs.Cascades{"report.export": {OnFailed: []string{
		`INSERT INTO audit4 VALUES (@tenant_id, @type, @job_id, @parent_id, @job_id || '@x')`,
		`INSERT INTO audit4 (a, c) VALUES ('second', @job_id)`,
	}}})
	db.Insert(t, jobstest.Job{ID: "C1", Type: "report.export", Generation: 1, ParentID: "P1", TenantID: "T1",
		StartedAgo: jobstest.Ago(31 * time.Minute), IdleAgo: 21 * time.Minute})
	db.Insert(t, jobstest.Job{ID: "C2", Type: "report.export", Generation: 1,
		StartedAgo: jobstest.Ago(31 * time.Minute), IdleAgo: 21 * time.Minute})
	res, err := store.ReapBatch(ctx, pgstore.ReapBatchParams{Candidates: readCandidates(t, store, "C1", "C2"),
		Reason: jobs.ReasonStalled, Rule: rule})
	requireNoErr(t, err)
	if len(res.Reaped) != 2 {
		t.Fatalf("reaped %+v, want C1 and C2", res.Reaped)
	}
	requireCount(t, db, 1, `SELECT count(*) FROM audit4 WHERE a = 'T1' AND b = 'report.export' AND c = 'C1' AND d = 'P1' AND e = 'C1@x'`)
	requireCount(t, db, 1, `SELECT count(*) FROM audit4 WHERE a IS NULL AND b = 'report.export' AND c = 'C2' AND d IS NULL AND e = 'C2@x'`)
	requireCount(t, db, 2, `SELECT count(*) FROM audit4 WHERE a = 'second' AND c IN ('C1', 'C2')`)
	requireCount(t, db, 4, `SELECT count(*) FROM audit4`)
}
