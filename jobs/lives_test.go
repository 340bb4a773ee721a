package jobs_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
)

// lifeRun is what one run of a job through runPages saw.
type lifeRun struct {
	lease    jobs.Lease
	replayed int
}

// runPages claims job id as its row stands and runs it: pages batches of
// 10 items through Advance (tokens page-1, page-2, ...), each writing its
// items in the batch's transaction unless replayed, then CompleteWith.
func runPages(t *testing.T, db *jobstest.DB, store *jobs.Store, id, worker string, pages int) lifeRun {
	t.Helper()
	ctx := context.Background()
	sn, err := store.Get(ctx, id)
	requireNoErr(t, err)
	run := lifeRun{lease: claim(t, store, id, sn.Generation, worker)}
	cursor := run.lease.Cursor
	for p := 1; p <= pages; p++ {
		err := inTx(t, db, func(tx pgx.Tx) error {
			res, err := store.Advance(ctx, tx, run.lease, fmt.Sprintf("page-%d", p), int64(10*(p-1)), 10)
			if err != nil {
				return err
			}
			cursor = res.Cursor
			if res.Replayed {
				run.replayed++
				return nil
			}
			_, err = tx.Exec(ctx, `INSERT INTO items (job_id, n) SELECT $1, g FROM generate_series($2::int, $2::int + 9) g`, id, 10*(p-1))
			return err
		})
		requireNoErr(t, err)
	}
	if cursor != int64(10*pages) {
		t.Fatalf("cursor after %d pages = %d, want %d", pages, cursor, 10*pages)
	}
	res, err := store.CompleteWith(ctx, db.Pool, run.lease, nil)
	requireNoErr(t, err)
	if !res.Confirmed || res.Replayed {
		t.Fatalf("completion of %s = %+v, want confirmed", run.lease.FencingToken(), res)
	}
	return run
}

// A job ID's second life, however it comes about, starts above every
// generation the ID had, so that nothing of the first life answers for it:
// besides the cases B32 runs through asynq, a life begun by an UPDATE that
// rewinds the row, a first life whose events and batches were pruned, and
// a first-life attempt still running when the second life begins.
func TestJobIDLives(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	setupLives := func(t *testing.T) (*jobstest.DB, *jobs.Store) {
		db, store := setup(t, nil)
		db.Exec(t, `CREATE TABLE items (job_id text NOT NULL, n int NOT NULL)`)
		return db, store
	}

	t.Run("AnUpdateThatRewindsTheRowStartsANewLife", func(t *testing.T) {
		t.Parallel()
		db, store := setupLives(t)
		db.Insert(t, jobstest.Job{ID: "R", Type: "report.export", Status: jobs.StatusQueued})
		first := runPages(t, db, store, "R", "W1", 3)
		if first.lease.FirstGeneration != 0 || first.lease.IdempotencyKey("charge") != "R:charge" {
			t.Fatalf("first life: lease %+v, key %q; want first generation 0 and key R:charge", first.lease, first.lease.IdempotencyKey("charge"))
		}
		// "Run it again" by resetting the row instead of deleting it.
		db.Exec(t, `DELETE FROM items WHERE job_id = 'R'`)
		db.Exec(t, `UPDATE jobs SET status = 'QUEUED', "cursor" = 0, finished_at = NULL WHERE id = 'R'`)
		r := db.Read(t, "R")
		if r.Generation != 2 || r.FirstGeneration != 2 || r.Cursor != 0 {
			t.Fatalf("reset row = %+v, want generation 2 starting a life at 2, cursor 0", r)
		}
		second := runPages(t, db, store, "R", "W1", 3)
		if second.replayed != 0 {
			t.Fatalf("%d of the second life's batches were answered Replayed by the first life's tokens", second.replayed)
		}
		requireRow(t, db, "R", jobs.StatusCompleted, 3, 30)
		requireCount(t, db, 30, `SELECT count(*) FROM items WHERE job_id = 'R'`)
		if k := second.lease.IdempotencyKey("charge"); k != "R@2:charge" || k == first.lease.IdempotencyKey("charge") {
			t.Fatalf("second life's key = %q, want R@2:charge", k)
		}
		// A product that lowers the generation gets a new life too, never a
		// generation the ID had.
		db.Exec(t, `UPDATE jobs SET status = 'QUEUED', generation = 0, finished_at = NULL WHERE id = 'R'`)
		if r := db.Read(t, "R"); r.Generation != 4 || r.FirstGeneration != 4 {
			t.Fatalf("row after lowering the generation = %+v, want generation 4 starting a life", r)
		}
	})

	t.Run("EachRecordOfTheIDCountsAlone", func(t *testing.T) {
		t.Parallel()
		db, store := setupLives(t)
		// R's first life reaches generation 2: its first attempt is
		// released for a retry, the second completes.
		db.Insert(t, jobstest.Job{ID: "R", Type: "report.export", Status: jobs.StatusQueued})
		requireNoErr(t, store.Release(ctx, claim(t, store, "R", 0, "W1")))
		runPages(t, db, store, "R", "W1", 3)
		// The product prunes R's events and batches, then deletes the row:
		// the deleted row's generation is remembered.
		db.Exec(t, `DELETE FROM job_events WHERE job_id = 'R'`)
		db.Exec(t, `DELETE FROM job_batches WHERE job_id = 'R'`)
		db.Exec(t, `DELETE FROM jobs WHERE id = 'R'`)
		requireCount(t, db, 2, `SELECT generation FROM job_past_lives WHERE job_id = 'R'`)
		db.Insert(t, jobstest.Job{ID: "R", Type: "report.export", Status: jobs.StatusQueued})
		if r := db.Read(t, "R"); r.Generation != 3 || r.FirstGeneration != 3 {
			t.Fatalf("R inserted again = %+v, want generation 3 starting a life", r)
		}

		// S's row was deleted before the ID's deletions were remembered
		// (no job_past_lives row): its events still count.
		db.Insert(t, jobstest.Job{ID: "S", Type: "report.export", Status: jobs.StatusQueued})
		runPages(t, db, store, "S", "W1", 1)
		db.Exec(t, `DELETE FROM jobs WHERE id = 'S'`)
		db.Exec(t, `DELETE FROM job_past_lives WHERE job_id = 'S'`)
		db.Exec(t, `DELETE FROM job_batches WHERE job_id = 'S'`)
		db.Insert(t, jobstest.Job{ID: "S", Type: "report.export", Status: jobs.StatusQueued})
		if r := db.Read(t, "S"); r.Generation != 2 || r.FirstGeneration != 2 {
			t.Fatalf("S inserted again = %+v, want generation 2 (above its claimed event's 1)", r)
		}
		// ... and so do its batches alone.
		db.Exec(t, `INSERT INTO job_batches (job_id, token, generation, expected_cursor, count, cursor_after)
VALUES ('T', 'page-1', 7, 0, 10, 10)`)
		db.Insert(t, jobstest.Job{ID: "T", Type: "report.export", Status: jobs.StatusQueued})
		if r := db.Read(t, "T"); r.Generation != 8 || r.FirstGeneration != 8 {
			t.Fatalf("T = %+v, want generation 8 (above its batch's 7)", r)
		}
		// A fresh ID starts at the generation it is inserted with.
		db.Insert(t, jobstest.Job{ID: "U", Type: "report.export", Status: jobs.StatusQueued})
		if r := db.Read(t, "U"); r.Generation != 0 || r.FirstGeneration != 0 {
			t.Fatalf("U = %+v, want generation 0", r)
		}
	})

	t.Run("FirstLifeAttemptStillRunningIsRefusedByTheSecond", func(t *testing.T) {
		t.Parallel()
		db, store := setupLives(t)
		db.Insert(t, jobstest.Job{ID: "R", Type: "report.export", Status: jobs.StatusQueued})
		zombie := claim(t, store, "R", 0, "W1") // generation 1, hangs
		db.Exec(t, `DELETE FROM jobs WHERE id = 'R'`)
		db.Insert(t, jobstest.Job{ID: "R", Type: "report.export", Status: jobs.StatusQueued})
		live := claim(t, store, "R", 2, "W2")
		if live.Generation != 3 || live.FencingToken() == zombie.FencingToken() || live.IdempotencyKey("x") == zombie.IdempotencyKey("x") {
			t.Fatalf("second life's lease %+v against the first's %+v: want generation 3 and another token and key", live, zombie)
		}
		hb, _ := heartbeater(t, store)
		_, err := hb.Heartbeat(ctx, zombie, 5)
		requireIs(t, err, jobs.ErrStaleWorker)
		res, err := hb.Heartbeat(ctx, live, 1)
		requireNoErr(t, err)
		if !res.Written {
			t.Fatalf("the second life's heartbeat = %+v, want written (its window is its own)", res)
		}
		err = inTx(t, db, func(tx pgx.Tx) error {
			_, err := store.Advance(ctx, tx, zombie, "page-1", 0, 10)
			return err
		})
		requireIs(t, err, jobs.ErrStaleWorker)
		_, err = store.CompleteWith(ctx, db.Pool, zombie, nil)
		requireIs(t, err, jobs.ErrStaleWorker)
		requireRow(t, db, "R", jobs.StatusProcessing, 3, 0)
		requireCount(t, db, 0, `SELECT count(*) FROM job_batches WHERE job_id = 'R'`)
	})

	// The product deletes the row and inserts the ID again in one
	// transaction while a first-life attempt's write waits for the row's
	// lock. The waiting statement's snapshot cannot see the new row, but the
	// row is there: the answer is stale, as for any other superseded
	// attempt, with its late_result_rejected event, never "job not found".
	t.Run("FirstLifeWriteThatWaitedOnTheRowBeingReplacedIsStale", func(t *testing.T) {
		t.Parallel()
		for _, tc := range []struct {
			op    string
			write func(db *jobstest.DB, store *jobs.Store, zombie jobs.Lease) error
		}{
			{"Advance", func(db *jobstest.DB, store *jobs.Store, zombie jobs.Lease) error {
				return inTx(t, db, func(tx pgx.Tx) error {
					_, err := store.Advance(ctx, tx, zombie, "page-1", 0, 10)
					return err
				})
			}},
			{"CheckCompleted", func(db *jobstest.DB, store *jobs.Store, zombie jobs.Lease) error {
				return inTx(t, db, func(tx pgx.Tx) error { return store.CheckCompleted(ctx, tx, zombie) })
			}},
			{"Heartbeat", func(_ *jobstest.DB, store *jobs.Store, zombie jobs.Lease) error {
				hb, _ := heartbeater(t, store)
				_, err := hb.Heartbeat(ctx, zombie, 5)
				return err
			}},
		} {
			db, store := setupLives(t)
			db.Insert(t, jobstest.Job{ID: "R", Type: "report.export", Status: jobs.StatusQueued, Total: ptr[int64](30)})
			zombie := claim(t, store, "R", 0, "W1")
			product, pid := conn(t, db)
			for _, sql := range []string{`BEGIN`, `DELETE FROM jobs WHERE id = 'R'`,
				`INSERT INTO jobs (id, type, status, total) VALUES ('R', 'report.export', 'QUEUED', 30)`} {
				if _, err := product.Exec(ctx, sql); err != nil {
					t.Fatal(err)
				}
			}
			out := make(chan error, 1)
			go func() { out <- tc.write(db, store, zombie) }()
			jobstest.Eventually(t, tc.op+" waits for the row's lock", func() bool {
				return db.Count(t, `SELECT count(*) FROM pg_stat_activity
 WHERE wait_event_type = 'Lock' AND pid <> $1 AND position($2 in query) > 0`, pid, db.Schema) == 1
			})
			if _, err := product.Exec(ctx, `COMMIT`); err != nil {
				t.Fatal(err)
			}
			err := <-out
			if !errors.Is(err, jobs.ErrStaleWorker) {
				t.Fatalf("%s of the first life after the second replaced the row: %v, want %v", tc.op, err, jobs.ErrStaleWorker)
			}
			requireLate(t, db, "R", [2]string{tc.op, "stale_worker"})
			requireRow(t, db, "R", jobs.StatusQueued, 2, 0)
		}
	})
}

// An upgrade changes nothing for a job already in flight: a row written
// before the lives migration starts its life at 0, so its attempt's
// idempotency key stays "<id>:<step>" (an external API keyed by it must not
// bill the retry of a step the first attempt made), and its recorded
// batches still replay for every attempt.
func TestUpgradeKeepsTheKeysAndBatchesOfJobsInFlight(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema := jobstest.SchemaName(t)
	pool, err := jobs.Connect(ctx, jobstest.DatabaseURL(), schema)
	requireNoErr(t, err)
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
		pool.Close()
	})
	requireNoErr(t, jobs.MigrateUpTo(ctx, pool, schema, 2))
	table := func(name string) string { return pgx.Identifier{schema, name}.Sanitize() }
	exec := func(sql string, args ...any) {
		t.Helper()
		if _, err := pool.Exec(ctx, sql, args...); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	// What the previous release left: R claimed at generation 1, one
	// batch recorded, the attempt still running.
	exec(`INSERT INTO ` + table("job_types") + ` (name, max_runtime) VALUES ('report.export', '30 minutes')`)
	exec(`INSERT INTO ` + table("jobs") + ` (id, type, status, generation, worker, started_at, "cursor", total)
VALUES ('R', 'report.export', 'PROCESSING', 1, 'W1', now(), 10, 30)`)
	exec(`INSERT INTO ` + table("job_events") + ` (job_id, kind, generation, worker) VALUES ('R', 'claimed', 1, 'W1')`)
	exec(`INSERT INTO ` + table("job_batches") + ` (job_id, token, generation, expected_cursor, count, cursor_after)
VALUES ('R', 'page-1', 1, 0, 10, 10)`)
	inFlight := jobs.Lease{JobID: "R", Generation: 1, Worker: "W1", Type: "report.export", Cursor: 10, Total: 30}
	keyBefore := inFlight.IdempotencyKey("charge")

	applied, err := jobs.Migrate(ctx, pool, schema)
	if err != nil || len(applied) == 0 || applied[0] != 3 {
		t.Fatalf("upgrade applied %v (err %v), want version 3 first", applied, err)
	}
	store := jobs.NewStore(pool, jobs.WithSchema(schema))
	sn, err := store.Get(ctx, "R")
	requireNoErr(t, err)
	if sn.FirstGeneration != 0 || sn.Generation != 1 {
		t.Fatalf("R after the upgrade = generation %d, first generation %d; want 1 and 0", sn.Generation, sn.FirstGeneration)
	}
	advance := func(lease jobs.Lease, token string, expected int64) jobs.AdvanceResult {
		t.Helper()
		tx, err := pool.Begin(ctx)
		requireNoErr(t, err)
		defer func() { _ = tx.Rollback(ctx) }()
		res, err := store.Advance(ctx, tx, lease, token, expected, 10)
		requireNoErr(t, err)
		requireNoErr(t, tx.Commit(ctx))
		return res
	}
	if res := advance(inFlight, "page-1", 0); !res.Replayed || res.Cursor != 10 {
		t.Fatalf("replay of the batch recorded before the upgrade = %+v, want Replayed at 10", res)
	}
	if res := advance(inFlight, "page-2", 10); res.Replayed || res.Cursor != 20 {
		t.Fatalf("next batch = %+v, want a new batch at 20", res)
	}
	// asynq retries the task: the next attempt of the same life.
	requireNoErr(t, store.Release(ctx, inFlight))
	retry := claim(t, store, "R", 1, "W2")
	if retry.FirstGeneration != 0 || retry.IdempotencyKey("charge") != keyBefore || keyBefore != "R:charge" {
		t.Fatalf("retry's key = %q (first generation %d), want the in-flight attempt's %q = R:charge",
			retry.IdempotencyKey("charge"), retry.FirstGeneration, keyBefore)
	}
	for i, token := range []string{"page-1", "page-2"} {
		if res := advance(retry, token, int64(10*i)); !res.Replayed {
			t.Fatalf("retry's %s = %+v, want Replayed", token, res)
		}
	}
}
