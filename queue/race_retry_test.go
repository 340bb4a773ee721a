package queue_test

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jackc/pgx/v5"

	"github.com/jobreaper/jobreaper/internal/asynqstate"
	"github.com/jobreaper/jobreaper/internal/pgstore"
	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
	"github.com/jobreaper/jobreaper/queue"
	"github.com/jobreaper/jobreaper/queue/redistest"
	"github.com/jobreaper/jobreaper/reaper"
)

// retryRaceJobs is how many jobs TestReliabilityRace_RetryReaps runs.
const retryRaceJobs = 1000

// TestReliabilityRace_RetryReaps races 4 reapers (real passes, no leader
// lease: the compare-and-sets decide) and a real asynq worker behind the
// start guard over 1,000 jobs of a type with reap_retries = 1. Each
// attempt draws what its handler does: complete at once, hang honouring
// its context, or hang ignoring it and write late. Every job must end
// COMPLETED or FAILED, never both; each attempt's writes are fenced (a
// COMPLETED job has exactly one product row, written by its completing
// generation; a FAILED one has none); the on_failed cascade ran once per
// FAILED job and never for a COMPLETED one; and a life has at most
// reap_retries + 1 reaps, at most reap_retries of them retries.
func TestReliabilityRace_RetryReaps(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	var rngMu sync.Mutex
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	draw := func(n int) int {
		rngMu.Lock()
		defer rngMu.Unlock()
		return rng.IntN(n)
	}

	db := jobstest.New(t)
	db.JobType(t, "retry.job", "1 microsecond", "", "")
	db.Exec(t, `UPDATE job_types SET reap_retries = 1, reap_retry_delay = '10 milliseconds' WHERE name = 'retry.job'`)
	db.Exec(t, `CREATE TABLE products (job_id text NOT NULL, generation bigint NOT NULL)`)
	db.Exec(t, `CREATE TABLE cascade_log (job_id text NOT NULL, hook text NOT NULL)`)
	cascades := jobs.Cascades{"retry.job": {
		OnFailed:    []string{`INSERT INTO cascade_log VALUES (@job_id, 'failed')`},
		OnCompleted: []string{`INSERT INTO cascade_log VALUES (@job_id, 'completed')`},
	}}
	pool := connect(t, db, 16)
	store := jobs.NewStore(pool, jobs.WithSchema(db.Schema), jobs.WithCascades(cascades), jobs.WithEventsDB(connect(t, db, 4)))
	if err := store.PrepareCascades(ctx); err != nil {
		t.Fatal(err)
	}
	rc := redistest.Start(t).Client(t)
	markers, err := queue.NewMarkerStore(rc)
	if err != nil {
		t.Fatal(err)
	}

	// The worker: each attempt draws its behaviour.
	var zombies sync.WaitGroup
	t.Cleanup(zombies.Wait)
	mux := asynq.NewServeMux()
	mux.Use(queue.NewGuard(store, markers, queue.WithWorker("w1")).Middleware())
	mux.HandleFunc("retry.job", func(hctx context.Context, _ *asynq.Task) error {
		lease, err := jobs.LeaseFromContext(hctx)
		if err != nil {
			return err
		}
		complete := func(ctx context.Context) error {
			_, err := store.CompleteWith(ctx, pool, lease, func(tx pgx.Tx) error {
				_, err := tx.Exec(ctx, `INSERT INTO products VALUES ($1, $2)`, lease.JobID, lease.Generation)
				return err
			})
			return err
		}
		switch b := draw(10); {
		case b < 6: // completes within a few milliseconds
			time.Sleep(time.Duration(draw(5)) * time.Millisecond)
			return complete(hctx)
		case b < 9: // hangs on a call that honours its context, then tries to complete
			<-hctx.Done()
			return complete(context.WithoutCancel(hctx))
		default: // ignores its context: writes late, beside the next attempt
			zombies.Add(1)
			defer zombies.Done()
			time.Sleep(time.Duration(300+draw(300)) * time.Millisecond)
			return complete(context.WithoutCancel(hctx))
		}
	})
	srv := asynq.NewServerFromRedisClient(rc, asynq.Config{
		Queues: map[string]int{"rq": 1}, Concurrency: 20, ShutdownTimeout: time.Second, LogLevel: asynq.FatalLevel,
		IsFailure:      queue.IsFailure,
		RetryDelayFunc: func(int, error, *asynq.Task) time.Duration { return 20 * time.Millisecond },
	})

	// The jobs, some of whose tasks have no retry left (asynq archives
	// them on the cancel of a retry reap).
	ids := make([]string, retryRaceJobs)
	client := asynq.NewClientFromRedisClient(rc)
	for i := range ids {
		ids[i] = fmt.Sprintf("R%04d", i)
	}
	db.Exec(t, `INSERT INTO jobs (id, type, status, queue) SELECT id, 'retry.job', 'QUEUED', 'rq' FROM unnest($1::text[]) AS id`, ids)
	for _, id := range ids {
		if _, err := queue.Enqueue(ctx, client, store, asynq.NewTask("retry.job", nil), id, asynq.MaxRetry([]int{0, 3}[draw(2)])); err != nil {
			t.Fatal(err)
		}
	}
	if err := srv.Start(mux); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)

	// 4 reapers, each passing at random moments until every job ended.
	lister, err := asynqstate.NewIDLister(rc)
	if err != nil {
		t.Fatal(err)
	}
	var (
		retried, failedReaps, finished atomic.Int64
		passErrs                       atomic.Int64
		wg                             sync.WaitGroup
		byAction                       = map[string]*atomic.Int64{reaper.RetryReenqueued: {}, reaper.RetryCancelResent: {}, reaper.RetryFailedImpossible: {}}
		errLog                         = &lockedBuffer{}
	)
	rctx, stop := context.WithCancel(ctx)
	defer stop()
	for range 4 {
		r := reaper.New(pgstore.New(pool, pgstore.WithSchema(db.Schema), pgstore.WithCascades(cascades)), lister,
			asynqstate.NewMarkerWriter(rc, 0), reaper.Options{
				Queues: []string{"rq"}, Rule: raceRule(150 * time.Millisecond), Interval: 100 * time.Millisecond,
				Logger: slog.New(slog.NewTextHandler(errLog, &slog.HandlerOptions{Level: slog.LevelWarn})), Asynq: asynqstate.NewStatusReader(rc, 0),
				Canceller: asynqstate.NewCanceller(rc, 0), RetryCanceller: asynqstate.NewCanceller(rc, 0),
				Replacer: asynqstate.NewRetryReplacer(rc, pgstore.New(pool, pgstore.WithSchema(db.Schema))),
			})
		wg.Add(1)
		go func() {
			defer wg.Done()
			for rctx.Err() == nil {
				res, err := r.RunOnce(rctx)
				if rctx.Err() != nil {
					return
				}
				if err != nil || res.Errors > 0 {
					passErrs.Add(1)
				}
				retried.Add(int64(res.RetriedBy[jobs.ReasonStalled] + res.RetriedBy[jobs.ReasonLostTask]))
				failedReaps.Add(int64(res.Reaped - res.RetriedBy[jobs.ReasonStalled] - res.RetriedBy[jobs.ReasonLostTask]))
				for a, n := range res.RetriesFinished {
					finished.Add(int64(n))
					byAction[a].Add(int64(n))
				}
				time.Sleep(time.Duration(10+draw(50)) * time.Millisecond)
			}
		}()
	}
	deadline := time.Now().Add(5 * time.Minute)
	for {
		open := db.Count(t, `SELECT count(*) FROM jobs WHERE status IN ('QUEUED', 'PROCESSING')`)
		if open == 0 {
			break
		}
		if time.Now().After(deadline) {
			stop()
			wg.Wait()
			t.Fatalf("%d jobs still QUEUED or PROCESSING after 5 minutes (seed %d): %v", open, seed,
				db.Count(t, `SELECT count(*) FROM jobs WHERE status = 'QUEUED' AND reap_count > 0`))
		}
		time.Sleep(200 * time.Millisecond)
	}
	stop()
	wg.Wait()
	zombies.Wait() // every late write has landed or been refused
	t.Logf("retry reaps %d, failing reaps %d, retries finished by later passes %d (reenqueued %d, cancel_resent %d, failed_impossible %d), passes with errors %d",
		retried.Load(), failedReaps.Load(), finished.Load(), byAction[reaper.RetryReenqueued].Load(), byAction[reaper.RetryCancelResent].Load(),
		byAction[reaper.RetryFailedImpossible].Load(), passErrs.Load())
	t.Logf("warnings and errors of the passes (first 3000 bytes):\n%s", errLog.head(3000))

	for _, c := range []struct{ name, sql string }{
		{"not_completed_or_failed", `SELECT id || ' is ' || status FROM jobs WHERE status NOT IN ('COMPLETED', 'FAILED')`},
		{"completed_and_failed", `SELECT e.job_id FROM job_events e WHERE e.kind = 'completed'
  AND EXISTS (SELECT FROM job_events f WHERE f.job_id = e.job_id AND (f.kind = 'failed' OR f.kind = 'reaped' AND f.detail->>'retry' = 'false'))`},
		{"completed_without_exactly_its_product_row", `SELECT j.id FROM jobs j WHERE j.status = 'COMPLETED'
  AND (SELECT count(*) FROM products p WHERE p.job_id = j.id) <> 1
   OR j.status = 'COMPLETED' AND NOT EXISTS (SELECT FROM products p WHERE p.job_id = j.id AND p.generation = j.generation)`},
		{"failed_with_a_product_row", `SELECT j.id FROM jobs j WHERE j.status = 'FAILED' AND EXISTS (SELECT FROM products p WHERE p.job_id = j.id)`},
		{"cascades_not_once", `SELECT j.id FROM jobs j WHERE
  (SELECT count(*) FROM cascade_log c WHERE c.job_id = j.id AND c.hook = 'failed') <> (j.status = 'FAILED')::int
  OR (SELECT count(*) FROM cascade_log c WHERE c.job_id = j.id AND c.hook = 'completed') <> (j.status = 'COMPLETED')::int`},
		{"more_reaps_than_the_budget", `SELECT j.id || ' reaped ' || count(*) FROM jobs j JOIN job_types t ON t.name = j.type
  JOIN job_events e ON e.job_id = j.id AND e.kind = 'reaped' GROUP BY j.id, t.reap_retries HAVING count(*) > t.reap_retries + 1
  OR count(*) FILTER (WHERE e.detail->>'retry' = 'true') > t.reap_retries`},
		{"reap_count_is_not_its_retries", `SELECT j.id FROM jobs j
 WHERE j.reap_count <> (SELECT count(*) FROM job_events e WHERE e.job_id = j.id AND e.kind = 'reaped' AND e.detail->>'retry' = 'true')`},
	} {
		rows, err := db.Pool.Query(ctx, c.sql)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		bad, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if len(bad) > 0 {
			t.Errorf("%s (seed %d): %d jobs, first %v", c.name, seed, len(bad), bad[:min(5, len(bad))])
		}
	}
	if retried.Load() == 0 || failedReaps.Load() == 0 {
		t.Errorf("the run never raced what it exists for: %d retry reaps, %d failing reaps", retried.Load(), failedReaps.Load())
	}
}

// lockedBuffer collects the reapers' warnings, safe for concurrent use.
type lockedBuffer struct {
	mu  sync.Mutex
	buf []byte
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf = append(b.buf, p...)
	return len(p), nil
}

func (b *lockedBuffer) head(n int) string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return string(b.buf[:min(n, len(b.buf))])
}
