package pgstore_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/jobreaper/jobreaper/internal/pgstore"
	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
)

func TestCancel(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cascades := jobs.Cascades{"report.export": {OnFailed: []string{
		`UPDATE parents SET failed_children = failed_children + 1 WHERE id = @parent_id`}}}

	setupParents := func(t *testing.T) (*jobstest.DB, *testStore) {
		db := jobstest.New(t)
		baselineTypes(t, db)
		db.Exec(t, `CREATE TABLE parents (id text PRIMARY KEY, failed_children int NOT NULL DEFAULT 0)`)
		db.Exec(t, `INSERT INTO parents (id) VALUES ('P')`)
		store := stores(db, cascades)
		requireNoErr(t, store.PrepareCascades(ctx))
		return db, store
	}

	t.Run("FailsARunningJobWithItsCascadeAndEventAndRefusesItsLateWrites", func(t *testing.T) {
		t.Parallel()
		db, store := setupParents(t)
		lease := queued(t, db, store, jobstest.Job{ID: "C1", Type: "report.export", ParentID: "P", Queue: "q"}, "w1")
		res, err := store.Cancel(ctx, pgstore.CancelParams{JobID: "C1", Reason: "customer asked", Operator: "ops@host"})
		requireNoErr(t, err)
		if res.PreviousStatus != jobs.StatusProcessing || res.Generation != 1 || res.Queue != "q" || res.Type != "report.export" {
			t.Fatalf("result = %+v", res)
		}
		r := requireRow(t, db, "C1", jobs.StatusFailed, 1, 0)
		if r.FailureReason != jobs.ReasonCancelled || !r.Finished {
			t.Fatalf("row = %+v, want failure_reason cancelled and finished", r)
		}
		requireCount(t, db, 1, `SELECT failed_children FROM parents WHERE id = 'P'`)
		requireCount(t, db, 1, `SELECT count(*) FROM `+db.Table("job_events")+
			` WHERE job_id = 'C1' AND kind = 'cancelled' AND generation = 1
               AND detail->>'reason' = 'customer asked' AND detail->>'previous_status' = 'PROCESSING'`)
		// The attempt's Complete is refused and recorded.
		_, err = store.CompleteWith(ctx, db.Pool, lease, func(pgx.Tx) error { return nil })
		requireIs(t, err, jobs.ErrJobTerminal)
		if late := db.LateResults(t, "C1"); len(late) != 1 || late[0].CurrentFailureReason != jobs.ReasonCancelled {
			t.Fatalf("late results = %+v", late)
		}
		// The marker repair sees it like a reap.
		missing, err := store.ListMissingMarkers(ctx, res.DBNow.Add(time.Second), 7*24*time.Hour, 0)
		requireNoErr(t, err)
		if len(missing) != 1 || missing[0].JobID != "C1" || missing[0].Generation != 1 {
			t.Fatalf("missing markers = %+v", missing)
		}
	})

	t.Run("FailsAQueuedJob", func(t *testing.T) {
		t.Parallel()
		db, store := setupParents(t)
		db.Insert(t, jobstest.Job{ID: "C2", Type: "report.export", Status: jobs.StatusQueued})
		res, err := store.Cancel(ctx, pgstore.CancelParams{JobID: "C2", Reason: "duplicate"})
		requireNoErr(t, err)
		if res.PreviousStatus != jobs.StatusQueued {
			t.Fatalf("previous status %s", res.PreviousStatus)
		}
		requireRow(t, db, "C2", jobs.StatusFailed, 0, 0)
		// A claim of the cancelled job is refused.
		_, err = store.Claim(ctx, "C2", 0, "w")
		requireIs(t, err, jobs.ErrClaimLost)
	})

	t.Run("RefusesTerminalAndUnknownJobsAndWritesNothing", func(t *testing.T) {
		t.Parallel()
		db, store := setupParents(t)
		db.Insert(t, jobstest.Job{ID: "C3", Type: "report.export", Status: jobs.StatusCompleted})
		db.Insert(t, jobstest.Job{ID: "C4", Type: "report.export", Status: jobs.StatusFailed})
		for _, id := range []string{"C3", "C4"} {
			_, err := store.Cancel(ctx, pgstore.CancelParams{JobID: id, Reason: "x"})
			requireIs(t, err, jobs.ErrJobTerminal)
		}
		_, err := store.Cancel(ctx, pgstore.CancelParams{JobID: "nope", Reason: "x"})
		requireIs(t, err, jobs.ErrNotFound)
		_, err = store.Cancel(ctx, pgstore.CancelParams{JobID: "C3", Reason: "  "})
		requireIs(t, err, jobs.ErrInvalidArgument)
		requireCount(t, db, 0, `SELECT count(*) FROM `+db.Table("job_events"))
		requireCount(t, db, 0, `SELECT failed_children FROM parents WHERE id = 'P'`)
	})

	t.Run("FailCannotStoreTheReservedCode", func(t *testing.T) {
		t.Parallel()
		requireIs(t, jobs.CheckFailureCode(jobs.ReasonCancelled), jobs.ErrInvalidArgument)
	})
}

func TestPrune(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	setupHistory := func(t *testing.T) (*jobstest.DB, *testStore) {
		db, store := setup(t, nil)
		// OLD1, OLD2: finished 9 days ago; NEW: 7 days ago; RUN: running.
		for _, id := range []string{"OLD1", "OLD2", "NEW", "RUN"} {
			db.Insert(t, jobstest.Job{ID: id, Type: "report.export", Status: jobs.StatusProcessing, StartedAgo: jobstest.Ago(time.Hour)})
			for i := range 3 {
				db.Exec(t, `INSERT INTO `+db.Table("job_events")+` (job_id, kind, generation) VALUES ($1, 'claimed', $2)`, id, i)
				db.Exec(t, `INSERT INTO `+db.Table("job_batches")+` (job_id, token, generation, expected_cursor, count, cursor_after)
VALUES ($1, $2, 1, $3::bigint, 1, $3::bigint + 1)`, id, "page-"+string(rune('a'+i)), i)
			}
		}
		db.Exec(t, `UPDATE `+db.Table("jobs")+` SET status = 'COMPLETED', finished_at = now() - interval '9 days' WHERE id = 'OLD1'`)
		db.Exec(t, `UPDATE `+db.Table("jobs")+` SET status = 'FAILED', failure_reason = 'stalled', finished_at = now() - interval '9 days' WHERE id = 'OLD2'`)
		db.Exec(t, `UPDATE `+db.Table("jobs")+` SET status = 'COMPLETED', finished_at = now() - interval '7 days' WHERE id = 'NEW'`)
		return db, store
	}

	t.Run("RemovesExactlyTheOldRecordsInBatches", func(t *testing.T) {
		t.Parallel()
		db, store := setupHistory(t)
		dry, err := store.Prune(ctx, pgstore.PruneParams{OlderThan: 8 * 24 * time.Hour, DryRun: true})
		requireNoErr(t, err)
		if dry.Events != 6 || dry.Batches != 6 {
			t.Fatalf("dry run = %+v, want 6 events and 6 batches", dry)
		}
		requireCount(t, db, 12, `SELECT count(*) FROM `+db.Table("job_events"))
		// Batches of 4 make the loop run more than once per table.
		res, err := store.Prune(ctx, pgstore.PruneParams{OlderThan: 8 * 24 * time.Hour, BatchSize: 4})
		requireNoErr(t, err)
		if res.Events != 6 || res.Batches != 6 {
			t.Fatalf("prune = %+v, want 6 events and 6 batches", res)
		}
		requireCount(t, db, 0, `SELECT count(*) FROM `+db.Table("job_events")+` WHERE job_id IN ('OLD1', 'OLD2')`)
		requireCount(t, db, 0, `SELECT count(*) FROM `+db.Table("job_batches")+` WHERE job_id IN ('OLD1', 'OLD2')`)
		requireCount(t, db, 6, `SELECT count(*) FROM `+db.Table("job_events")+` WHERE job_id IN ('NEW', 'RUN')`)
		requireCount(t, db, 6, `SELECT count(*) FROM `+db.Table("job_batches")+` WHERE job_id IN ('NEW', 'RUN')`)
		requireCount(t, db, 4, `SELECT count(*) FROM `+db.Table("jobs"))
	})

	t.Run("RecordsEachRunThatDeletesInPruneRuns", func(t *testing.T) {
		t.Parallel()
		db, store := setupHistory(t)
		_, err := store.Prune(ctx, pgstore.PruneParams{OlderThan: 8 * 24 * time.Hour, DryRun: true, Operator: "ops@host"})
		requireNoErr(t, err)
		requireCount(t, db, 0, `SELECT count(*) FROM `+db.Table("prune_runs"))
		res, err := store.Prune(ctx, pgstore.PruneParams{OlderThan: 8 * 24 * time.Hour, Operator: "ops@host"})
		requireNoErr(t, err)
		requireCount(t, db, 1, `SELECT count(*) FROM `+db.Table("prune_runs")+`
 WHERE older_than = interval '8 days' AND cutoff = $1 AND events = 6 AND batches = 6 AND complete
   AND operator = 'ops@host' AND at >= cutoff + older_than AND at <= now()`, res.Cutoff)
	})

	t.Run("RecordsARunStoppedByAnErrorWithWhatItDeleted", func(t *testing.T) {
		t.Parallel()
		db, store := setupHistory(t)
		// The events go first; then the batch records' DELETE fails.
		db.Exec(t, `CREATE FUNCTION `+db.Table("refuse_delete")+`() RETURNS trigger LANGUAGE plpgsql AS
$$BEGIN RAISE EXCEPTION 'batch records are kept'; END$$`)
		db.Exec(t, `CREATE TRIGGER refuse_delete BEFORE DELETE ON `+db.Table("job_batches")+
			` FOR EACH ROW EXECUTE FUNCTION `+db.Table("refuse_delete")+`()`)
		res, err := store.Prune(ctx, pgstore.PruneParams{OlderThan: 8 * 24 * time.Hour})
		if err == nil || !strings.Contains(err.Error(), "batch records are kept") {
			t.Fatalf("err = %v, want the failed DELETE", err)
		}
		if res.Events != 6 || res.Batches != 0 {
			t.Fatalf("result = %+v, want the 6 events deleted before the error", res)
		}
		requireCount(t, db, 1, `SELECT count(*) FROM `+db.Table("prune_runs")+
			` WHERE events = 6 AND batches = 0 AND NOT complete AND operator IS NULL`)
	})

	t.Run("RefusesLessThanEightDays", func(t *testing.T) {
		t.Parallel()
		db, store := setupHistory(t)
		_, err := store.Prune(ctx, pgstore.PruneParams{OlderThan: 7 * 24 * time.Hour})
		requireIs(t, err, jobs.ErrInvalidArgument)
		if !strings.Contains(err.Error(), "8 days") {
			t.Fatalf("err = %v", err)
		}
		requireCount(t, db, 12, `SELECT count(*) FROM `+db.Table("job_events"))
	})
}

func TestInspect(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, store := setup(t, nil)
	lease := queued(t, db, store, jobstest.Job{ID: "I1", Type: "report.export", Queue: "q", Total: ptr(int64(30))}, "w1")
	for i, tok := range []string{"page-1", "page-2"} {
		requireNoErr(t, inTx(t, db, func(tx pgx.Tx) error {
			_, err := store.Advance(ctx, tx, lease, tok, int64(i*10), 10)
			return err
		}))
	}
	rec, err := store.Inspect(ctx, "I1", 1, 10)
	requireNoErr(t, err)
	if rec.Status != jobs.StatusProcessing || rec.Generation != 1 || rec.Worker != "w1" || rec.Queue != "q" ||
		rec.Cursor != 20 || rec.Total == nil || *rec.Total != 30 || rec.Limits == nil || rec.Limits.MaxRuntime != 30*time.Minute {
		t.Fatalf("record = %+v", rec)
	}
	if rec.Runtime == nil || *rec.Runtime < 0 || rec.Idle == nil || *rec.Idle < 0 || rec.Infinite != nil {
		t.Fatalf("runtime %v idle %v", rec.Runtime, rec.Idle)
	}
	if rec.BatchCount != 2 || len(rec.Batches) != 1 || rec.Batches[0].Token != "page-2" {
		t.Fatalf("batches: count %d, last %+v", rec.BatchCount, rec.Batches)
	}
	if rec.EventCount != 1 || len(rec.Events) != 1 || rec.Events[0].Kind != "claimed" {
		t.Fatalf("events: count %d, %+v", rec.EventCount, rec.Events)
	}
	// A finished job's runtime is its last attempt's, up to finished_at:
	// it does not keep growing after the job ended.
	// Its idle time stops there too.
	db.Exec(t, `UPDATE jobs SET status = 'FAILED', failure_reason = 'stalled',
       started_at = now() - interval '1 hour', updated_at = now() - interval '55 minutes',
       finished_at = now() - interval '50 minutes' WHERE id = 'I1'`)
	rec, err = store.Inspect(ctx, "I1", 1, 10)
	requireNoErr(t, err)
	if rec.Runtime == nil || *rec.Runtime != 10*time.Minute {
		t.Fatalf("runtime of a FAILED job = %v, want 10m0s (started_at to finished_at)", rec.Runtime)
	}
	if rec.Idle == nil || *rec.Idle != 5*time.Minute {
		t.Fatalf("idle of a FAILED job = %v, want 5m0s (updated_at to finished_at)", rec.Idle)
	}

	// Infinite timestamps, which the product's own SQL can write, are
	// shown as such, and nothing is computed from them.
	db.Exec(t, `UPDATE jobs SET created_at = '-infinity', started_at = 'infinity', updated_at = '-infinity',
       finished_at = 'infinity', marker_set_at = '-infinity' WHERE id = 'I1'`)
	rec, err = store.Inspect(ctx, "I1", 1, 10)
	requireNoErr(t, err)
	wantInf := map[string]string{"created_at": "-infinity", "started_at": "infinity", "updated_at": "-infinity",
		"finished_at": "infinity", "marker_set_at": "-infinity"}
	if fmt.Sprint(rec.Infinite) != fmt.Sprint(wantInf) || rec.Runtime != nil || rec.Idle != nil ||
		!rec.CreatedAt.IsZero() || rec.FinishedAt != nil || rec.MarkerSetAt != nil || rec.StartedAt != nil {
		t.Fatalf("record with infinite timestamps: infinite %v runtime %v idle %v created %v finished %v marker %v started %v",
			rec.Infinite, rec.Runtime, rec.Idle, rec.CreatedAt, rec.FinishedAt, rec.MarkerSetAt, rec.StartedAt)
	}
	_, err = store.Inspect(ctx, "missing", 5, 5)
	requireIs(t, err, jobs.ErrNotFound)
}
