package pgstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/jobreaper/jobreaper/internal/pgstore"
	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
)

func TestRetryReap(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	// setupRetry returns a schema with a type of 2 retries whose on_failed
	// cascade counts into cascade_log, and job J1 stalled at generation 1.
	setupRetry := func(t *testing.T) (*jobstest.DB, *testStore) {
		t.Helper()
		db := jobstest.New(t)
		baselineTypes(t, db)
		db.Exec(t, `CREATE TABLE cascade_log (n bigserial PRIMARY KEY, job_id text NOT NULL)`)
		db.JobType(t, "retry.type", "30 minutes", "", "")
		db.Exec(t, `UPDATE job_types SET reap_retries = 2, reap_retry_delay = '5 seconds' WHERE name = 'retry.type'`)
		store := stores(db, jobs.Cascades{"retry.type": {OnFailed: []string{`INSERT INTO cascade_log (job_id) VALUES (@job_id)`}}})
		db.Insert(t, jobstest.Job{ID: "J1", Type: "retry.type", Generation: 1, Worker: "w1", Queue: "q",
			StartedAgo: jobstest.Ago(31 * time.Minute), IdleAgo: 21 * time.Minute})
		return db, store
	}
	retryCand := func(t *testing.T, store *testStore) pgstore.ReapCandidate {
		c := readCandidates(t, store, "J1")[0]
		c.Retry = true
		return c
	}

	t.Run("PutsTheRowBackToQueuedWithItsGenerationAndCountRaisedAndNoCascade", func(t *testing.T) {
		t.Parallel()
		db, store := setupRetry(t)
		res, err := store.ReapBatch(ctx, pgstore.ReapBatchParams{Candidates: []pgstore.ReapCandidate{retryCand(t, store)}, Reason: jobs.ReasonStalled, Rule: rule})
		requireNoErr(t, err)
		if len(res.Reaped) != 1 || !res.Reaped[0].Retry || res.Reaped[0].Evidence.Generation != 1 || res.Reaped[0].Evidence.ReapCount != 1 ||
			res.Reaped[0].Evidence.ReapRetries != 2 || res.Reaped[0].RetryDelay != 5*time.Second {
			t.Fatalf("result = %+v, want one retry reap of generation 1, count 1 of 2, delay 5s", res)
		}
		requireCount(t, db, 1, `SELECT count(*) FROM jobs WHERE id = 'J1' AND status = 'QUEUED' AND generation = 2 AND reap_count = 1
   AND finished_at IS NULL AND failure_reason IS NULL AND marker_set_at IS NULL`)
		requireCount(t, db, 1, `SELECT count(*) FROM job_events WHERE job_id = 'J1' AND kind = 'reaped' AND generation = 1
   AND detail->>'retry' = 'true' AND (detail->>'reap_count')::int = 1 AND detail->>'reason' = 'stalled'`)
		requireCount(t, db, 0, `SELECT count(*) FROM cascade_log`)

		// The hung attempt's late write is refused.
		_, err = store.worker.CompleteWith(ctx, db.Pool, jobs.Lease{JobID: "J1", Generation: 1}, func(pgx.Tx) error { return nil })
		requireIs(t, err, jobs.ErrStaleWorker)
		requireCount(t, db, 1, `SELECT count(*) FROM job_events WHERE job_id = 'J1' AND kind = 'late_result_rejected'`)

		// The next delivery is claimed at generation 2; a requeue keeps
		// the count; a new life resets it.
		lease := claim(t, store, "J1", 2, "w2")
		if lease.Generation != 3 {
			t.Fatalf("claim took generation %d, want 3", lease.Generation)
		}
		requireCount(t, db, 1, `SELECT count(*) FROM jobs WHERE id = 'J1' AND reap_count = 1`)
		db.Exec(t, `DELETE FROM jobs WHERE id = 'J1'`)
		db.Exec(t, `INSERT INTO jobs (id, type, status, reap_count) VALUES ('J1', 'retry.type', 'QUEUED', 5)`)
		requireCount(t, db, 1, `SELECT count(*) FROM jobs WHERE id = 'J1' AND reap_count = 0`)
	})

	t.Run("ASpentBudgetMakesTheRetryChangedSinceRead", func(t *testing.T) {
		t.Parallel()
		db, store := setupRetry(t)
		c := retryCand(t, store)
		db.Exec(t, `UPDATE job_types SET reap_retries = 0 WHERE name = 'retry.type'`)
		res, err := store.ReapBatch(ctx, pgstore.ReapBatchParams{Candidates: []pgstore.ReapCandidate{c}, Reason: jobs.ReasonStalled, Rule: rule})
		requireNoErr(t, err)
		if len(res.Reaped) != 0 || len(res.Changed) != 1 {
			t.Fatalf("result = %+v, want J1 changed since read", res)
		}
		requireCount(t, db, 1, `SELECT count(*) FROM jobs WHERE id = 'J1' AND status = 'PROCESSING' AND generation = 1`)
	})

	t.Run("AnImpossibleRetryFailsWithItsFlag", func(t *testing.T) {
		t.Parallel()
		db, store := setupRetry(t)
		c := readCandidates(t, store, "J1")[0]
		c.RetryImpossible = true
		res, err := store.ReapBatch(ctx, pgstore.ReapBatchParams{Candidates: []pgstore.ReapCandidate{c}, Reason: jobs.ReasonLostTask, Rule: rule})
		requireNoErr(t, err)
		if len(res.Reaped) != 1 || res.Reaped[0].Retry {
			t.Fatalf("result = %+v, want one failing reap", res)
		}
		requireCount(t, db, 1, `SELECT count(*) FROM jobs WHERE id = 'J1' AND status = 'FAILED' AND failure_reason = 'lost_task' AND generation = 1`)
		requireCount(t, db, 1, `SELECT count(*) FROM job_events WHERE job_id = 'J1' AND kind = 'reaped' AND detail->>'reap_retry_impossible' = 'true'`)
		requireCount(t, db, 1, `SELECT count(*) FROM cascade_log`)
	})

	t.Run("LaterPassesListAndFailTheRetryReapedRows", func(t *testing.T) {
		t.Parallel()
		db, store := setupRetry(t)
		_, err := store.ReapBatch(ctx, pgstore.ReapBatchParams{Candidates: []pgstore.ReapCandidate{retryCand(t, store)}, Reason: jobs.ReasonStalled, Rule: rule})
		requireNoErr(t, err)
		// Not yet settled.
		got, err := store.ListRetryPending(ctx, pgstore.RetryPendingParams{Queues: []string{"q"}, Settle: time.Hour})
		requireNoErr(t, err)
		if len(got) != 0 {
			t.Fatalf("pending = %+v before the settle time", got)
		}
		got, err = store.ListRetryPending(ctx, pgstore.RetryPendingParams{Queues: []string{"q"}})
		requireNoErr(t, err)
		if len(got) != 1 || got[0].JobID != "J1" || got[0].Generation != 2 || got[0].ReapCount != 1 || got[0].Reason != jobs.ReasonStalled ||
			got[0].RetryDelay != 5*time.Second {
			t.Fatalf("pending = %+v, want J1 at generation 2", got)
		}
		// A claim since: the row is no longer pending, and the fail changes nothing.
		stale := got
		claim(t, store, "J1", 2, "w2")
		if got, _ = store.ListRetryPending(ctx, pgstore.RetryPendingParams{Queues: []string{"q"}}); len(got) != 0 {
			t.Fatalf("pending after a claim = %+v", got)
		}
		failed, err := store.FailRetryImpossible(ctx, stale)
		requireNoErr(t, err)
		if len(failed) != 0 {
			t.Fatalf("failed %+v, a claimed row", failed)
		}
		requireCount(t, db, 0, `SELECT count(*) FROM cascade_log`)
	})

	t.Run("FailRetryImpossibleFailsAPendingRowOnceWithItsCascade", func(t *testing.T) {
		t.Parallel()
		db, store := setupRetry(t)
		_, err := store.ReapBatch(ctx, pgstore.ReapBatchParams{Candidates: []pgstore.ReapCandidate{retryCand(t, store)}, Reason: jobs.ReasonStalled, Rule: rule})
		requireNoErr(t, err)
		got, err := store.ListRetryPending(ctx, pgstore.RetryPendingParams{Queues: []string{"q"}})
		requireNoErr(t, err)
		failed, err := store.FailRetryImpossible(ctx, got)
		requireNoErr(t, err)
		if len(failed) != 1 || failed[0].Evidence.Generation != 2 || !failed[0].Evidence.ReapRetryImpossible {
			t.Fatalf("failed = %+v, want J1 at generation 2", failed)
		}
		requireCount(t, db, 1, `SELECT count(*) FROM jobs WHERE id = 'J1' AND status = 'FAILED' AND failure_reason = 'stalled' AND marker_set_at IS NOT NULL`)
		requireCount(t, db, 1, `SELECT count(*) FROM job_events WHERE job_id = 'J1' AND kind = 'reaped' AND generation = 2
   AND detail->>'reap_retry_impossible' = 'true'`)
		requireCount(t, db, 1, `SELECT count(*) FROM cascade_log`)
		if failed, err = store.FailRetryImpossible(ctx, got); err != nil || len(failed) != 0 {
			t.Fatalf("second fail = %+v, %v, want nothing", failed, err)
		}
		requireCount(t, db, 1, `SELECT count(*) FROM cascade_log`)
	})
}
