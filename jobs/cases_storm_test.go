package jobs_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jonboulle/clockwork"

	"github.com/jobreaper/jobreaper/internal/pgstore"
	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
)

// TestCase_B16_HeartbeatWriteStormAndAStaleHeartbeat runs the case with
// its full population: 2,000 PROCESSING jobs over 20 worker processes (one
// Heartbeater and one fake clock each), every job calling Heartbeat with an
// advancing mark for 10 simulated minutes. By default each job calls once a
// second (1.2 million calls); with JOBREAPER_TEST_FULL_STORM=1 it calls 10
// times a second as in the case (12 million calls, about 40 s under -race
// on two cores, hogging a parallel-test slot). The limiter sees the same
// 5-minute windows either way, so the asserted writes are the same.
//
// The bound is per attempt: at most one write per attempt per process per
// 5 minutes, so at most 2 per attempt over the 10 minutes. Besides the
// plain jobs (2 writes each, at 0:00 and 5:00) the run has a restarted
// process (process 0 restarts at 7:00: a third write per job, the one extra
// heartbeat a restart may add), a process whose 100 jobs asynq retries in
// the same process at 3:00 (attempt 1 keeps calling and is refused as
// stale; 1 write for attempt 1, 2 for attempt 2), and J16 (1 write, then
// reaped): 4,199 in all. The work is in-process; only the writes the
// limiter lets through reach PostgreSQL, where a trigger counts them with
// their generation.
func TestCase_B16_HeartbeatWriteStormAndAStaleHeartbeat(t *testing.T) {
	t.Parallel()
	const (
		processes      = 20
		jobsPerProcess = 100
	)
	callEvery := time.Second
	if os.Getenv("JOBREAPER_TEST_FULL_STORM") == "1" {
		callEvery = 100 * time.Millisecond // about 10 calls a second per job
	}
	var (
		steps      = int(10 * time.Minute / callEvery)
		j16Starts  = int(61 * time.Second / callEvery)  // J16's handler begins at 1:01
		j16Reaped  = int(6 * time.Minute / callEvery)   // the reaper fails J16 at 6:00
		j16Flushed = int(361 * time.Second / callEvery) // its heartbeat lands at 6:01
		restartAt  = int(7 * time.Minute / callEvery)   // process 0 restarts at 7:00
		retryAt    = int(3 * time.Minute / callEvery)   // process 3's jobs get attempt 2 at 3:00
	)
	ctx := context.Background()
	db, store := setup(t, nil)
	countWrites(t, db)
	db.Exec(t, `INSERT INTO jobs (id, type, status)
SELECT 'p' || p || '-j' || j, 'crawl.site', 'QUEUED' FROM generate_series(0, $1::int - 1) p, generate_series(0, $2::int - 1) j`,
		processes, jobsPerProcess)
	const j16 = "p1-j0"

	type outcome struct {
		stats     []jobs.HeartbeatStats
		j16Result jobs.HeartbeatResult
		j16Err    error
		j16Before time.Time
	}
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		out  outcome
		fail = func(format string, args ...any) { t.Errorf(format, args...) }
	)
	for p := range processes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			leases := make([]jobs.Lease, jobsPerProcess)
			for j := range leases {
				l, err := store.Claim(ctx, fmt.Sprintf("p%d-j%d", p, j), 0, fmt.Sprintf("W%d", p))
				if err != nil {
					fail("claim: %v", err)
					return
				}
				leases[j] = l
			}
			clock := clockwork.NewFakeClockAt(epoch)
			hb, _ := jobs.NewHeartbeater(store, clock, 0)
			var (
				stats      []jobs.HeartbeatStats
				superseded []jobs.Lease // attempt 1 of process 3's jobs, still calling
			)
			j16Done := false
			for step := range steps {
				if p == 0 && step == restartAt {
					stats = append(stats, hb.Stats())
					hb, _ = jobs.NewHeartbeater(store, clock, 0) // the process restarts
				}
				if p == 3 && step == retryAt { // asynq retries every job here
					superseded = leases
					leases = make([]jobs.Lease, len(superseded))
					for j, old := range superseded {
						l, err := store.Claim(ctx, old.JobID, old.Generation, old.Worker)
						if err != nil {
							fail("claim of attempt 2: %v", err)
							return
						}
						leases[j] = l
					}
				}
				if p == 1 && step == j16Reaped {
					reapJ16(t, db, store, &mu, &out.j16Before)
				}
				for j, l := range leases {
					isJ16 := l.JobID == j16
					if isJ16 && (step < j16Starts || j16Done) {
						continue
					}
					res, err := hb.Heartbeat(ctx, l, int64(step+1))
					switch {
					case isJ16 && step == j16Flushed:
						mu.Lock()
						out.j16Result, out.j16Err = res, err
						mu.Unlock()
						j16Done = true
					case err != nil:
						fail("heartbeat of job %d at step %d: %v", j, step, err)
						return
					}
				}
				// Attempt 1 of the retried jobs goes on calling after attempt 2.
				for _, l := range superseded {
					if _, err := hb.Heartbeat(ctx, l, int64(step+1)); !errors.Is(err, jobs.ErrStaleWorker) {
						fail("heartbeat of superseded attempt %s at step %d: err = %v, want ErrStaleWorker", l.FencingToken(), step, err)
						return
					}
				}
				clock.Advance(callEvery)
			}
			stats = append(stats, hb.Stats())
			mu.Lock()
			out.stats = append(out.stats, stats...)
			mu.Unlock()
			if p == 2 { // status writes are never throttled
				for _, l := range leases {
					if _, err := store.CompleteWith(ctx, db.Pool, l, func(pgx.Tx) error { return nil }); err != nil {
						fail("complete %s: %v", l.JobID, err)
					}
				}
			}
		}()
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}

	// Heartbeat UPDATEs: <= 1 per attempt per process per 5 minutes.
	var calls, written, refused uint64
	for _, s := range out.stats {
		calls += s.Calls
		written += s.Written
		refused += s.Refused
	}
	const (
		plain     = (processes-2)*jobsPerProcess - 1 // 2 writes each: 0:00 and 5:00
		restarted = jobsPerProcess                   // 3 writes: 0:00, 5:00 and 7:00 after the restart
		retried   = jobsPerProcess                   // attempt 1 at 0:00; attempt 2 at 3:00 and 8:00
	)
	wantWrites := int64(2*plain + 3*restarted + 3*retried + 1) // J16 wrote once, at 1:01
	requireCount(t, db, wantWrites, `SELECT count(*) FROM heartbeat_writes`)
	if int64(written) != wantWrites {
		t.Fatalf("Heartbeater stats say %d writes, the table %d", written, wantWrites)
	}
	// At most 2 per attempt over the 10 minutes, in every process but the
	// restarted one, where the restart adds at most 1 per job.
	requireCount(t, db, 0, `SELECT count(*) FROM (SELECT job_id, generation FROM heartbeat_writes
 WHERE job_id NOT LIKE 'p0-%' GROUP BY job_id, generation HAVING count(*) > 2) x`)
	requireCount(t, db, 0, `SELECT count(*) FROM (SELECT job_id, generation FROM heartbeat_writes
 WHERE job_id LIKE 'p0-%' GROUP BY job_id, generation HAVING count(*) > 3) x`)
	requireCount(t, db, jobsPerProcess, `SELECT count(*) FROM (SELECT job_id FROM heartbeat_writes
 WHERE job_id LIKE 'p0-%' GROUP BY job_id HAVING count(*) = 3) x`)
	// The retried jobs: attempt 2 got its own windows, untouched by
	// attempt 1's calls, which were refused as stale (one round trip per
	// attempt per interval at most).
	requireCount(t, db, jobsPerProcess, `SELECT count(*) FROM (SELECT job_id FROM heartbeat_writes
 WHERE job_id LIKE 'p3-%' GROUP BY job_id
HAVING count(*) FILTER (WHERE generation = 1) = 1 AND count(*) FILTER (WHERE generation = 2) = 2) x`)
	if lates := db.Count(t, `SELECT count(*) FROM job_events WHERE job_id LIKE 'p3-%' AND kind = 'late_result_rejected'`); lates > 3*jobsPerProcess {
		t.Fatalf("late_result_rejected events of the superseded attempts = %d, want at most 3 per attempt (one per interval)", lates)
	}
	t.Logf("%d heartbeat calls, %d UPDATEs, %d refused", calls, wantWrites, refused)

	// The late J16 heartbeat changed nothing.
	requireIs(t, out.j16Err, jobs.ErrJobTerminal)
	if !out.j16Result.Sent || out.j16Result.Written {
		t.Fatalf("J16's late heartbeat = %+v, want sent and not written", out.j16Result)
	}
	r := requireRow(t, db, j16, jobs.StatusFailed, 1, 0)
	if !r.UpdatedAt.Equal(out.j16Before) {
		t.Fatalf("J16's updated_at moved from %v to %v", out.j16Before, r.UpdatedAt)
	}
	requireLate(t, db, j16, [2]string{"Heartbeat", "job_terminal"})
	requireCount(t, db, jobsPerProcess, `SELECT count(*) FROM jobs WHERE id LIKE 'p2-%' AND status = 'COMPLETED'`)
}

// reapJ16 makes J16 stalled (its heartbeats stopped landing) and reaps it,
// recording its updated_at after the reap.
func reapJ16(t *testing.T, db *jobstest.DB, store *jobs.Store, mu *sync.Mutex, after *time.Time) {
	ctx := context.Background()
	if _, err := db.Pool.Exec(ctx, `UPDATE jobs SET started_at = now() - interval '2 hours',
       updated_at = now() - interval '20 minutes' WHERE id = 'p1-j0'`); err != nil {
		t.Errorf("backdating J16: %v", err)
		return
	}
	sn, err := store.Get(ctx, "p1-j0")
	if err == nil {
		var reaped bool
		reaped, _, err = jobs.DaemonOf(store).Reap(ctx, pgstore.ReapParams{JobID: sn.ID, Generation: sn.Generation,
			UpdatedAt: sn.UpdatedAt, Reason: jobs.ReasonStalled, Rule: rule})
		if err == nil && !reaped {
			err = fmt.Errorf("J16 was not reaped")
		}
	}
	if err != nil {
		t.Errorf("reaping J16: %v", err)
		return
	}
	var at time.Time
	if err := db.Pool.QueryRow(ctx, `SELECT updated_at FROM jobs WHERE id = 'p1-j0'`).Scan(&at); err != nil {
		t.Errorf("reading J16: %v", err)
	}
	mu.Lock()
	*after = at
	mu.Unlock()
}
