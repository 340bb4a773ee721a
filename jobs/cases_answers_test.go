package jobs_test

import (
	"context"
	"hash/fnv"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/jobreaper/jobreaper/internal/pgstore"
	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
)

// conn opens a connection of its own to the test schema, closed at
// cleanup, and returns it with its server process ID, so that a test can
// watch what that connection waits for.
func conn(t *testing.T, db *jobstest.DB) (*pgx.Conn, uint32) {
	t.Helper()
	c, err := pgx.Connect(context.Background(), db.URL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	return c, c.PgConn().PID()
}

// awaitLockWait waits until the server process pid waits for a lock of
// kind event (pg_stat_activity.wait_event: "advisory", "transactionid",
// "tuple"; "" for any).
func awaitLockWait(t *testing.T, db *jobstest.DB, pid uint32, what string) {
	t.Helper()
	jobstest.Eventually(t, what, func() bool {
		return db.Count(t, `SELECT count(*) FROM pg_stat_activity WHERE pid = $1 AND wait_event_type = 'Lock'`, pid) == 1
	})
}

// gate is an advisory lock a test holds on a connection of its own; a
// cascade statement that takes it (SELECT pg_advisory_xact_lock(key))
// holds its transaction, and so the job row, until the test opens it.
type gate struct {
	c   *pgx.Conn
	key int64
}

func closedGate(t *testing.T, db *jobstest.DB) *gate {
	t.Helper()
	h := fnv.New64a()
	_, _ = h.Write([]byte(db.Schema))
	g := &gate{key: int64(h.Sum64() >> 1)}
	g.c, _ = conn(t, db)
	if _, err := g.c.Exec(context.Background(), `SELECT pg_advisory_lock($1)`, g.key); err != nil {
		t.Fatal(err)
	}
	return g
}

func (g *gate) open(t *testing.T) {
	t.Helper()
	if _, err := g.c.Exec(context.Background(), `SELECT pg_advisory_unlock($1)`, g.key); err != nil {
		t.Fatal(err)
	}
}

// heldReap reaps job id through a Store on a connection of its own whose
// on_failed cascade waits at g, and returns once the reap's transaction
// has failed the row and waits in its cascade: the row stays locked until
// g opens. The reap's outcome arrives on the returned channel.
func heldReap(t *testing.T, db *jobstest.DB, g *gate, id string) <-chan error {
	t.Helper()
	c, pid := conn(t, db)
	cascadeWait := `SELECT pg_advisory_xact_lock(` + strconv.FormatInt(g.key, 10) + `)`
	reaper := pgstore.New(c, pgstore.WithSchema(db.Schema), pgstore.WithCascades(jobs.Cascades{"report.export": {OnFailed: []string{cascadeWait}}}))
	sn, err := db.Store().Get(context.Background(), id)
	requireNoErr(t, err)
	out := make(chan error, 1)
	go func() {
		reaped, _, err := reaper.Reap(context.Background(), pgstore.ReapParams{
			JobID: id, Generation: sn.Generation, UpdatedAt: sn.UpdatedAt, Reason: jobs.ReasonStalled, Rule: rule,
		})
		if err == nil && !reaped {
			err = context.Canceled // any error: the test wants a reap
		}
		out <- err
	}()
	awaitLockWait(t, db, pid, "the reap waits in its cascade, holding the row")
	return out
}

// TestCase_B36_HeartbeatRacingAReapOrAClaimAnswersTheStateAfterIt: the
// reaper's transaction has failed J36 and runs a slow cascade (held here
// on an advisory lock instead of a sleep, so no timing decides the
// order); the worker's Heartbeat, with an advancing mark, waits on the row
// lock meanwhile and proceeds after the reap commits. It must answer
// ErrJobTerminal and record a late_result_rejected event, not "not
// written, no error"; the same for a heartbeat racing a new claim
// (ErrStaleWorker).
func TestCase_B36_HeartbeatRacingAReapOrAClaimAnswersTheStateAfterIt(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("HeartbeatWaitingOnAReapIsTerminal", func(t *testing.T) {
		t.Parallel()
		db, store := setup(t, nil)
		countWrites(t, db)
		lease := queued(t, db, store, jobstest.Job{ID: "J36", Type: "report.export"}, "W1")
		backdate(t, db, "J36", 40*time.Minute, 20*time.Minute)
		g := closedGate(t, db)
		reaped := heldReap(t, db, g, "J36")

		c, pid := conn(t, db)
		hb, _ := heartbeater(t, jobs.NewStore(c, jobs.WithSchema(db.Schema)))
		type answer struct {
			res jobs.HeartbeatResult
			err error
		}
		beat := make(chan answer, 1)
		go func() {
			res, err := hb.Heartbeat(ctx, lease, 5)
			beat <- answer{res, err}
		}()
		awaitLockWait(t, db, pid, "the heartbeat waits on the reaped row")
		g.open(t)
		requireNoErr(t, <-reaped)
		a := <-beat

		requireIs(t, a.err, jobs.ErrJobTerminal)
		if !a.res.Sent || a.res.Written {
			t.Fatalf("heartbeat = %+v, want sent and not written", a.res)
		}
		r := requireRow(t, db, "J36", jobs.StatusFailed, 1, 0)
		if r.FailureReason != jobs.ReasonStalled || r.ProgressMark != 0 || writes(t, db, "J36") != 0 {
			t.Fatalf("J36 = %+v, want reaped as stalled and no heartbeat write", r)
		}
		d := requireLate(t, db, "J36", [2]string{"Heartbeat", "job_terminal"})
		if d[0].CurrentStatus != jobs.StatusFailed || d[0].CurrentFailureReason != jobs.ReasonStalled || d[0].FencingToken != "J36:1" {
			t.Fatalf("late result = %+v, want J36:1 refused by the FAILED (stalled) row", d[0])
		}
	})

	t.Run("HeartbeatWaitingOnANewClaimIsStale", func(t *testing.T) {
		t.Parallel()
		db, store := setup(t, nil)
		countWrites(t, db)
		lease := queued(t, db, store, jobstest.Job{ID: "J36", Type: "report.export"}, "W1")
		tx, err := db.Pool.Begin(ctx)
		requireNoErr(t, err)
		defer func() { _ = tx.Rollback(ctx) }()
		if l := claim(t, jobs.NewStore(tx, jobs.WithSchema(db.Schema)), "J36", 1, "W2"); l.Generation != 2 {
			t.Fatalf("new claim = %+v, want generation 2", l)
		}

		c, pid := conn(t, db)
		hb, _ := heartbeater(t, jobs.NewStore(c, jobs.WithSchema(db.Schema)))
		type answer struct {
			res jobs.HeartbeatResult
			err error
		}
		beat := make(chan answer, 1)
		go func() {
			res, err := hb.Heartbeat(ctx, lease, 5)
			beat <- answer{res, err}
		}()
		awaitLockWait(t, db, pid, "the heartbeat waits on the row the claim holds")
		requireNoErr(t, tx.Commit(ctx))
		a := <-beat

		requireIs(t, a.err, jobs.ErrStaleWorker)
		if !a.res.Sent || a.res.Written {
			t.Fatalf("heartbeat = %+v, want sent and not written", a.res)
		}
		if r := requireRow(t, db, "J36", jobs.StatusProcessing, 2, 0); r.Worker != "W2" || r.ProgressMark != 0 {
			t.Fatalf("J36 = %+v, want W2's attempt untouched", r)
		}
		d := requireLate(t, db, "J36", [2]string{"Heartbeat", "stale_worker"})
		if d[0].StaleGeneration != 1 || d[0].CurrentGeneration != 2 {
			t.Fatalf("late result = %+v, want generation 1 refused while 2 owns the job", d[0])
		}
	})
}

// Every other write that answers about the row answers with the row after
// the write it waited for: Advance and SetTotal waiting on a reap's row
// lock are refused as terminal with their events, and a Heartbeater call
// that would have been throttled answers with what it knows of the
// attempt (a newer attempt heartbeating here) instead of "throttled, fine".
func TestWritesWaitingOnAReapAnswerTheStateAfterIt(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("AdvanceAndSetTotal", func(t *testing.T) {
		t.Parallel()
		db, store := setup(t, nil)
		lease := queued(t, db, store, jobstest.Job{ID: "J", Type: "report.export", Total: ptr[int64](100)}, "W1")
		backdate(t, db, "J", 40*time.Minute, 20*time.Minute)
		g := closedGate(t, db)
		reaped := heldReap(t, db, g, "J")

		advanceConn, advancePID := conn(t, db)
		totalConn, totalPID := conn(t, db)
		advanced, totalled := make(chan error, 1), make(chan error, 1)
		go func() {
			tx, err := advanceConn.Begin(ctx)
			if err == nil {
				// Events go outside the batch's transaction, as in production.
				_, err = jobs.NewStore(advanceConn, jobs.WithSchema(db.Schema), jobs.WithEventsDB(db.Pool)).Advance(ctx, tx, lease, "page-1", 0, 10)
				_ = tx.Rollback(ctx)
			}
			advanced <- err
		}()
		go func() { totalled <- jobs.NewStore(totalConn, jobs.WithSchema(db.Schema)).SetTotal(ctx, lease, 200) }()
		awaitLockWait(t, db, advancePID, "Advance waits on the reaped row")
		awaitLockWait(t, db, totalPID, "SetTotal waits on the reaped row")
		g.open(t)
		requireNoErr(t, <-reaped)

		requireIs(t, <-advanced, jobs.ErrJobTerminal)
		requireIs(t, <-totalled, jobs.ErrJobTerminal)
		if r := requireRow(t, db, "J", jobs.StatusFailed, 1, 0); r.Total != 100 {
			t.Fatalf("total = %d, want 100 untouched", r.Total)
		}
		requireCount(t, db, 0, `SELECT count(*) FROM job_batches WHERE job_id = 'J'`)
		requireCount(t, db, 2, `SELECT count(*) FROM job_events WHERE job_id = 'J' AND kind = 'late_result_rejected'
   AND detail->>'code' = 'job_terminal' AND detail->>'operation' IN ('Advance', 'SetTotal')`)
	})

	t.Run("ThrottledCallOfASupersededAttempt", func(t *testing.T) {
		t.Parallel()
		db, store := setup(t, nil)
		a1 := queued(t, db, store, jobstest.Job{ID: "J", Type: "video.transcode"}, "W1")
		hb, clock := heartbeater(t, store)
		_, err := hb.Heartbeat(ctx, a1, 1)
		requireNoErr(t, err)
		a2 := claim(t, store, "J", 1, "W1")
		clock.Advance(time.Minute) // inside attempt 1's window
		_, err = hb.Heartbeat(ctx, a2, 1)
		requireNoErr(t, err)
		res, err := hb.Heartbeat(ctx, a1, 2)
		requireIs(t, err, jobs.ErrStaleWorker)
		if !res.Sent || res.Throttled {
			t.Fatalf("superseded attempt's call inside its window = %+v, want sent and refused, not throttled", res)
		}
		requireLate(t, db, "J", [2]string{"Heartbeat", "stale_worker"})
	})
}
