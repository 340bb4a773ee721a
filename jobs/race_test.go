package jobs_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"testing"

	"github.com/jobreaper/jobreaper/internal/pgstore"
	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
)

// races is how many late completions each flow races against a reap.
const races = 500

// raceFlow describes one flow for raceLateCompletion.
type raceFlow struct {
	typ      string
	schema   string
	cascades jobs.Cascades
	// seed inserts the product rows of jobs j1..jN, whose parent_id is
	// p1..pN.
	seed string
	// work runs attempt i's ending. It returns ErrJobTerminal when the reap
	// won; a flow may allow other errors after a confirmed completion.
	work func(ctx context.Context, store *jobs.Store, db *jobstest.DB, lease jobs.Lease, i int) error
	// check asserts the flow's invariants over all jobs at the end.
	check func(t *testing.T, db *jobstest.DB)
}

// raceLateCompletion sets up races jobs of one flow in one schema, every
// job already stalled (started 3 h ago, idle 1 h), and for each runs the
// worker's completion and the reaper's reap in two goroutines released at
// once. Exactly one of them must win each race; the flow's check then
// asserts that no job mixes the two outcomes.
func raceLateCompletion(t *testing.T, f raceFlow) {
	ctx := context.Background()
	db, store := setup(t, f.cascades)
	db.Exec(t, f.schema)
	db.Exec(t, f.seed, races)
	db.Exec(t, `INSERT INTO jobs (id, type, status, parent_id, tenant_id)
SELECT 'j' || i, $1, 'QUEUED', 'p' || i, 't1' FROM generate_series(1, $2::int) i`, f.typ, races)
	ids := make([]string, races)
	leases := make([]jobs.Lease, races)
	for i := range races {
		ids[i] = fmt.Sprintf("j%d", i+1)
		leases[i] = claim(t, store, ids[i], 0, "w1")
	}
	db.Exec(t, `UPDATE jobs SET started_at = now() - interval '3 hours', updated_at = now() - interval '1 hour'`)
	snaps, err := jobs.DaemonOf(store).LoadForTasks(ctx, ids) // the reaper's batched read
	requireNoErr(t, err)

	// Races run raceLanes at a time (distinct jobs) on a pool with room for
	// each lane's reap, completion and late_result_rejected connections.
	pool, err := jobs.Connect(ctx, db.URL+"&pool_max_conns=16", db.Schema)
	requireNoErr(t, err)
	t.Cleanup(pool.Close)
	wide := *db
	wide.Pool = pool
	store = jobs.NewStore(pool, jobs.WithSchema(db.Schema), jobs.WithCascades(f.cascades))

	const raceLanes = 4
	var (
		mu                  sync.Mutex
		completedN, reapedN int
		next                = make(chan int)
		lanes               sync.WaitGroup
	)
	for range raceLanes {
		lanes.Add(1)
		go func() {
			defer lanes.Done()
			for i := range next {
				won, err := raceOne(ctx, store, &wide, f, leases[i], snaps[ids[i]], i)
				mu.Lock()
				switch {
				case err != nil:
					t.Error(err)
				case won == jobs.StatusFailed:
					reapedN++
				default:
					completedN++
				}
				mu.Unlock()
			}
		}()
	}
	for i := range ids {
		next <- i
	}
	close(next)
	lanes.Wait()
	if t.Failed() {
		t.FailNow()
	}
	if completedN == 0 || reapedN == 0 {
		t.Fatalf("%d races: %d completed, %d reaped; both sides must win some for the test to mean anything", races, completedN, reapedN)
	}
	t.Logf("%d races: %d completed, %d reaped", races, completedN, reapedN)
	requireCount(t, db, int64(reapedN), `SELECT count(*) FROM jobs WHERE status = 'FAILED'`)
	requireCount(t, db, int64(reapedN), `SELECT count(*) FROM job_events WHERE kind = 'reaped'`)
	requireCount(t, db, int64(reapedN), `SELECT count(*) FROM job_events WHERE kind = 'late_result_rejected'`)
	requireCount(t, db, int64(completedN), `SELECT count(*) FROM job_events WHERE kind = 'completed'`)
	f.check(t, db)
}

// raceOne races attempt i's completion against its reap, released at once
// from two goroutines, and returns the status of the winner: COMPLETED or
// FAILED. It returns an error unless exactly one side won and the job row
// agrees.
func raceOne(ctx context.Context, store *jobs.Store, db *jobstest.DB, f raceFlow, lease jobs.Lease, snap jobs.Snapshot, i int) (string, error) {
	var (
		wg        sync.WaitGroup
		gate      = make(chan struct{})
		reaped    bool
		reapErr   error
		workErr   error
		reapFirst = i%2 == 0 // alternate which side yields once, so both win often
	)
	wg.Add(2)
	go func() {
		defer wg.Done()
		<-gate
		if !reapFirst {
			runtime.Gosched()
		}
		reaped, _, reapErr = jobs.DaemonOf(store).Reap(ctx, pgstore.ReapParams{
			JobID: lease.JobID, Generation: snap.Generation, UpdatedAt: snap.UpdatedAt,
			Reason: jobs.ReasonStalled, Rule: rule,
		})
	}()
	go func() {
		defer wg.Done()
		<-gate
		if reapFirst {
			runtime.Gosched()
		}
		workErr = f.work(ctx, store, db, lease, i)
	}()
	close(gate)
	wg.Wait()
	if reapErr != nil {
		return "", reapErr
	}
	var status string
	if err := db.Pool.QueryRow(ctx, `SELECT status FROM jobs WHERE id = $1`, lease.JobID).Scan(&status); err != nil {
		return "", err
	}
	switch {
	case reaped && status == jobs.StatusFailed && errors.Is(workErr, jobs.ErrJobTerminal):
	case !reaped && status == jobs.StatusCompleted && !errors.Is(workErr, jobs.ErrJobTerminal):
	default:
		return "", fmt.Errorf("race %s: reaped = %v, status %s, worker error %v", lease.JobID, reaped, status, workErr)
	}
	return status, nil
}

func TestLateCompletionRacedAgainstReap(t *testing.T) {
	t.Parallel()

	t.Run("CourseIsCompletedWithItsChapterOrFailedWithNone", func(t *testing.T) {
		t.Parallel()
		raceLateCompletion(t, raceFlow{
			typ: "report.export", schema: jobstest.CourseSchema,
			seed: `INSERT INTO courses (id) SELECT 'p' || i FROM generate_series(1, $1::int) i`,
			work: func(ctx context.Context, store *jobs.Store, db *jobstest.DB, lease jobs.Lease, _ int) error {
				_, err := jobstest.AddChapters(ctx, store, db, lease)
				return err
			},
			check: func(t *testing.T, db *jobstest.DB) {
				requireCount(t, db, 0, `SELECT count(*) FROM jobs j WHERE status = 'COMPLETED' AND
  (SELECT count(*) FROM chapters c JOIN lessons l ON l.chapter_id = c.id JOIN lectures x ON x.lesson_id = l.id WHERE c.job_id = j.id) <> 1`)
				requireCount(t, db, 0, `SELECT count(*) FROM jobs j WHERE status <> 'COMPLETED' AND EXISTS (SELECT FROM chapters WHERE job_id = j.id)`)
				requireCount(t, db, 0, `SELECT count(*) FROM courses c JOIN jobs j ON j.parent_id = c.id
 WHERE c.chapter_count <> (CASE WHEN j.status = 'COMPLETED' THEN 1 ELSE 0 END)`)
				requireCount(t, db, 0, `SELECT count(*) FROM lessons l WHERE NOT EXISTS (SELECT FROM chapters c JOIN jobs j ON j.id = c.job_id WHERE c.id = l.chapter_id AND j.status = 'COMPLETED')`)
			},
		})
	})

	t.Run("VideoIsChargedAtMostOnceAndOnlyWhenCompletedWithAllMetadata", func(t *testing.T) {
		t.Parallel()
		raceLateCompletion(t, raceFlow{
			typ: "video.transcode", schema: jobstest.VideoSchema,
			seed: `INSERT INTO videos (id) SELECT 'p' || i FROM generate_series(1, $1::int) i`,
			work: func(ctx context.Context, store *jobs.Store, db *jobstest.DB, lease jobs.Lease, i int) error {
				_, err := jobstest.ComposeVideo(ctx, store, db, lease, i%10 == 9) // every tenth metadata update fails
				return err
			},
			check: func(t *testing.T, db *jobstest.DB) {
				requireCount(t, db, 0, `SELECT count(*) FROM (SELECT job_id FROM usage GROUP BY job_id HAVING count(*) > 1) x`)
				requireCount(t, db, 0, `SELECT count(*) FROM usage u JOIN jobs j ON j.id = u.job_id JOIN videos v ON v.id = j.parent_id
 WHERE j.status <> 'COMPLETED' OR v.status <> 'READY' OR v.title IS NULL OR v.duration_s IS NULL OR v.thumbnail IS NULL`)
				requireCount(t, db, 0, `SELECT count(*) FROM jobs j JOIN videos v ON v.id = j.parent_id
 WHERE j.status = 'FAILED' AND (v.status <> 'RENDERING' OR v.title IS NOT NULL OR v.duration_s IS NOT NULL)`)
				requireCount(t, db, 0, `SELECT count(*) FROM jobs j JOIN videos v ON v.id = j.parent_id
 WHERE j.status = 'COMPLETED' AND v.status <> 'READY'`)
				// Completed jobs whose metadata all succeeded are charged exactly once.
				requireCount(t, db, 0, `SELECT count(*) FROM jobs j JOIN videos v ON v.id = j.parent_id
 WHERE j.status = 'COMPLETED' AND v.thumbnail IS NOT NULL AND NOT EXISTS (SELECT FROM usage WHERE job_id = j.id)`)
			},
		})
	})

	t.Run("ExportIsDoneOrFailedAndTheSourceStaysReady", func(t *testing.T) {
		t.Parallel()
		raceLateCompletion(t, raceFlow{
			typ: "report.export", schema: jobstest.ExportSchema, cascades: jobstest.ExportCascades,
			seed: `WITH s AS (INSERT INTO sources (id) SELECT 's' || i FROM generate_series(1, $1::int) i RETURNING id)
INSERT INTO exports (id, source_id) SELECT 'p' || substr(id, 2), id FROM s`,
			work: func(ctx context.Context, store *jobs.Store, db *jobstest.DB, lease jobs.Lease, _ int) error {
				return jobstest.Export(ctx, store, db, lease)
			},
			check: func(t *testing.T, db *jobstest.DB) {
				requireCount(t, db, 0, `SELECT count(*) FROM sources WHERE status <> 'READY'`)
				requireCount(t, db, 0, `SELECT count(*) FROM jobs j JOIN exports e ON e.id = j.parent_id
 WHERE NOT ((j.status = 'COMPLETED' AND e.status = 'DONE' AND e.url IS NOT NULL)
         OR (j.status = 'FAILED' AND e.status = 'FAILED' AND e.url IS NULL))`)
				requireCount(t, db, races, `SELECT count(*) FROM exports`)
			},
		})
	})

	t.Run("ParentIsReadyOrFailedOnceAndNeverNegative", func(t *testing.T) {
		t.Parallel()
		raceLateCompletion(t, raceFlow{
			typ: "video.transcode", schema: jobstest.ParentSchema, cascades: jobstest.ParentCascades("video.transcode", true),
			seed: `INSERT INTO parents (id, pending) SELECT 'p' || i, 1 FROM generate_series(1, $1::int) i`,
			work: func(ctx context.Context, store *jobs.Store, db *jobstest.DB, lease jobs.Lease, _ int) error {
				_, err := jobstest.CompleteChild(ctx, store, db, lease)
				return err
			},
			check: func(t *testing.T, db *jobstest.DB) {
				requireCount(t, db, 0, `SELECT count(*) FROM parents WHERE pending <> 0 OR completed + failed <> 1`)
				requireCount(t, db, 0, `SELECT count(*) FROM jobs j JOIN parents p ON p.id = j.parent_id
 WHERE NOT ((j.status = 'COMPLETED' AND p.status = 'READY') OR (j.status = 'FAILED' AND p.status = 'FAILED'))`)
				requireCount(t, db, races, `SELECT count(*) FROM parent_events`)
				requireCount(t, db, 0, `SELECT count(*) FROM usage u JOIN jobs j ON j.id = u.job_id WHERE j.status <> 'COMPLETED'`)
				requireCount(t, db, 0, `SELECT count(*) FROM notifications n JOIN jobs j ON j.id = n.job_id WHERE j.status <> 'FAILED'`)
			},
		})
	})
}
