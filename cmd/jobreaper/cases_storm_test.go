package main

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
	"github.com/jobreaper/jobreaper/queue"
	"github.com/jobreaper/jobreaper/queue/queuetest"
)

// The timings of B48. The stall timeout is 10 s (each type's own), the
// daemon's settings those of the case scaled up (--interval 1s,
// --heartbeat-interval 2s), and every live handler heartbeats every
// 200 ms through a Heartbeater that writes at most once a second.
const (
	b48Stall     = 10 * time.Second
	b48Tick      = 200 * time.Millisecond
	b48HBLimiter = time.Second
	// b48StormAt is when, after the cut, the first pass runs: every live
	// job's last write (at most one limiter interval before the cut, plus
	// a tick) is then older than the stall timeout, so the storm falls in
	// one pass. The passes are placed by the test: one that ran while only
	// some of the jobs had crossed the stall timeout would see fewer than
	// the limits hold (see docs/operating.md, Stall storms).
	b48StormAt = b48Stall + 2*time.Second
)

// b48Fleet is B48's in-process workers: an asynq server with the start
// guard, whose PostgreSQL pool the test can cut while the daemon's (each
// run --once's own) stays up.
type b48Fleet struct {
	db     *jobstest.DB
	cut    *jobstest.Cuttable
	rdb    *redis.Client
	client *asynq.Client
	// finish makes the live handlers return (their type auto-completes).
	finish     chan struct{}
	finishOnce sync.Once
}

func newB48Fleet(t *testing.T, queues ...string) *b48Fleet {
	t.Helper()
	db := jobstest.New(t)
	// max_runtime 1 s, so that every job is past it within a second of
	// its claim; the stall timeout is the type's own.
	db.JobType(t, "b48.live", "1 second", b48Stall.String(), "")
	db.Exec(t, `UPDATE job_types SET auto_complete = true WHERE name = 'b48.live'`)
	db.JobType(t, "b48.hang", "1 second", b48Stall.String(), "")
	f := &b48Fleet{db: db, cut: db.Cuttable(t), rdb: realRedis(t), finish: make(chan struct{})}
	f.client = asynq.NewClientFromRedisClient(f.rdb)
	t.Cleanup(func() { _ = f.client.Close() })
	workers := jobs.NewStore(f.cut.Pool, jobs.WithSchema(db.Schema))
	markers, err := queue.NewMarkerStore(f.rdb)
	if err != nil {
		t.Fatal(err)
	}
	hb, err := jobs.NewHeartbeater(workers, nil, b48HBLimiter)
	if err != nil {
		t.Fatal(err)
	}
	weights := map[string]int{}
	for _, q := range queues {
		weights[q] = 1
	}
	srv := asynq.NewServerFromRedisClient(f.rdb, asynq.Config{Queues: weights, Concurrency: 300,
		ShutdownTimeout: 500 * time.Millisecond, LogLevel: asynq.FatalLevel, IsFailure: queue.IsFailure})
	mux := asynq.NewServeMux()
	mux.Use(queue.NewGuard(workers, markers, queue.WithWorker("b48-worker")).Middleware())
	// A live handler reports progress every tick until told to finish; a
	// failed heartbeat (its PostgreSQL cut) is retried by the
	// Heartbeater after its backoff, and the handler goes on working.
	mux.HandleFunc("b48.live", func(ctx context.Context, _ *asynq.Task) error {
		lease, err := jobs.LeaseFromContext(ctx)
		if err != nil {
			return err
		}
		tick := time.NewTicker(b48Tick)
		defer tick.Stop()
		for mark := int64(1); ; mark++ {
			_, _ = hb.Heartbeat(ctx, lease, mark)
			select {
			case <-f.finish:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			case <-tick.C:
			}
		}
	})
	// A hung handler never reports progress (a call that never returns).
	mux.HandleFunc("b48.hang", func(ctx context.Context, _ *asynq.Task) error {
		<-ctx.Done()
		return ctx.Err()
	})
	if err := srv.Start(mux); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		f.finishOnce.Do(func() { close(f.finish) })
		srv.Shutdown()
		ctx := context.WithoutCancel(t.Context())
		for _, q := range queues {
			_ = queuetest.Remove(ctx, f.rdb, q)
		}
		if keys, err := f.rdb.Keys(ctx, queue.MarkerKey("b48-*")).Result(); err == nil && len(keys) > 0 {
			f.rdb.Del(ctx, keys...)
		}
	})
	return f
}

// start enqueues n jobs of typ into q through the enqueue helper and waits
// until the guard has claimed them all; it returns their IDs.
func (f *b48Fleet) start(t *testing.T, q, typ string, n int) []string {
	t.Helper()
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("b48-%s-%04d", q, i)
		f.db.Insert(t, jobstest.Job{ID: ids[i], Type: typ, Status: jobs.StatusQueued, Queue: q})
		if _, err := queue.Enqueue(t.Context(), f.client, f.db.Store(), asynq.NewTask(typ, nil), ids[i]); err != nil {
			t.Fatal(err)
		}
	}
	waitUntil(t, 30*time.Second, fmt.Sprintf("the %d jobs of %s are claimed", n, q), func() bool {
		return f.count(t, ids, `status = 'PROCESSING' AND started_at IS NOT NULL`) == int64(n)
	})
	return ids
}

// count counts the jobs among ids whose row matches where.
func (f *b48Fleet) count(t *testing.T, ids []string, where string) int64 {
	t.Helper()
	return f.db.Count(t, `SELECT count(*) FROM jobs WHERE id = ANY($1) AND `+where, ids)
}

// pass runs one daemon pass over queues: run --once, through its own pool.
func (f *b48Fleet) pass(t *testing.T, queues string) (int, onceSummary) {
	t.Helper()
	return once(t, f.db, queues, "--interval", "1s", "--heartbeat-interval", "2s", "--stall-timeout", b48Stall.String())
}

// sleepUntil waits until at, pacing the passes (never the test's proof).
func sleepUntil(at time.Time) { time.Sleep(time.Until(at)) }

// TestCase_B48_TheWorkersLosePostgreSQLTheDaemonDoesNot: 20 live jobs
// past max_runtime heartbeat every 200 ms from in-process workers whose
// PostgreSQL pool is cut while the daemon's passes (run --once, once a
// second) keep theirs:
//
//   - cut for half the stall timeout: no job ever looks stalled, nothing
//     is held or reaped;
//   - cut for 1.6 stall timeouts: every live job goes idle in one pass,
//     which is a stall storm: 0 of 20 reaped, a hold recorded for one
//     stall timeout; the heartbeats land again within the hold, so the
//     first pass after it reaps none, and the jobs finish COMPLETED.
//
// Then 200 jobs whose handlers really hang at once are held for one hold
// and reaped together by the first pass after it, and 50 more (in
// another queue, over the fraction) are reaped by the pass right after
// release-hold ends their hold. Not parallel: its margins are in seconds.
func TestCase_B48_TheWorkersLosePostgreSQLTheDaemonDoesNot(t *testing.T) {
	qLive, qHang, qRelease := unique("b48live"), unique("b48hang"), unique("b48rel")
	f := newB48Fleet(t, qLive, qHang, qRelease)
	live := f.start(t, qLive, "b48.live", 20)
	waitUntil(t, 30*time.Second, "every live job has heartbeated and is past max_runtime", func() bool {
		return f.count(t, live, `progress_mark > 0 AND now() - started_at > interval '1.5 seconds'`) == 20
	})
	requireQuiet := func(what string) {
		t.Helper()
		code, sum := f.pass(t, qLive)
		if code != exitOK || sum.Reaped != 0 || sum.StallStormHeld != 0 || sum.Errors != 0 || sum.Scanned != 20 {
			t.Fatalf("%s: exit %d, %+v; want a clean pass over 20 tasks, nothing reaped or held", what, code, sum)
		}
	}

	// A cut of half the stall timeout: nothing looks stalled.
	f.cut.Cut()
	cutAt := time.Now()
	for i := 1; i <= 8; i++ {
		sleepUntil(cutAt.Add(time.Duration(i) * time.Second))
		if i == 5 {
			f.cut.Restore()
		}
		requireQuiet(fmt.Sprintf("pass %d s after a %s cut began", i, b48Stall/2))
	}

	// A cut of 1.6 stall timeouts: a storm, held.
	waitUntil(t, 10*time.Second, "every live job has heartbeated since the short cut", func() bool {
		return f.count(t, live, `updated_at > now() - interval '2 seconds'`) == 20
	})
	f.cut.Cut()
	cutAt = time.Now()
	restoreAt := cutAt.Add(b48Stall * 16 / 10)
	sleepUntil(cutAt.Add(b48StormAt))
	code, sum := f.pass(t, qLive)
	if code != exitPassErrors || sum.Reaped != 0 || sum.StallStormHeld != 20 || sum.Errors != 0 ||
		len(sum.StallStormHolds) != 1 || !sum.StallStormHolds[0].Started || sum.StallStormHolds[0].Held != 20 {
		t.Fatalf("pass %s into the cut: exit %d, %+v; want the 20 live jobs held by a hold it started", b48StormAt, code, sum)
	}
	hold := sum.StallStormHolds[0]
	if got := hold.Until.Sub(time.Now()); got > b48Stall || got < b48Stall/2 {
		t.Fatalf("hold until %s, %s from now; want about one stall timeout (%s)", hold.Until, got, b48Stall)
	}
	if restoreAt.After(hold.Until.Add(-3 * time.Second)) {
		t.Fatalf("the cut ends at %s, too close to the hold's end %s for the test's margin", restoreAt, hold.Until)
	}
	restored := false
	var restoredDB, landedAt time.Time
	heartbeatedSince := func(at time.Time) int64 {
		return f.db.Count(t, `SELECT count(*) FROM jobs WHERE id = ANY($1) AND updated_at > $2`, live, at)
	}
	for n := 1; ; n++ {
		sleepUntil(cutAt.Add(b48StormAt + time.Duration(n)*time.Second))
		if !restored && time.Now().After(restoreAt) {
			f.cut.Restore()
			restored = true
			if err := f.db.Pool.QueryRow(t.Context(), `SELECT now()`).Scan(&restoredDB); err != nil {
				t.Fatal(err)
			}
		}
		code, sum = f.pass(t, qLive)
		if sum.Reaped != 0 || sum.Errors != 0 {
			t.Fatalf("pass %d during the hold: exit %d, %+v; want nothing reaped", n, code, sum)
		}
		if len(sum.StallStormHolds) == 0 {
			break // the first pass after the hold: it reaped none
		}
		if code != exitPassErrors || sum.StallStormHolds[0].ID != hold.ID {
			t.Fatalf("pass %d during the hold: exit %d, %+v; want exit 1 and hold %d", n, code, sum, hold.ID)
		}
		if restored && landedAt.IsZero() && heartbeatedSince(restoredDB) == 20 {
			landedAt = time.Now()
		}
	}
	if code != exitOK || !restored {
		t.Fatalf("first pass after the hold: exit %d, %+v (restored %v); want a clean pass", code, sum, restored)
	}
	if landedAt.IsZero() || landedAt.After(hold.Until) {
		t.Fatalf("the 20 heartbeats landed again at %s, want within the hold (until %s); %d have since the restore",
			landedAt, hold.Until, heartbeatedSince(restoredDB))
	}
	if n := f.db.Count(t, `SELECT count(*) FROM reaper_holds WHERE id = $1 AND drained_at IS NOT NULL`, hold.ID); n != 1 {
		t.Fatal("the first pass after the hold did not record it as drained")
	}
	f.finishOnce.Do(func() { close(f.finish) })
	waitUntil(t, 30*time.Second, "the 20 live jobs finish", func() bool {
		return f.count(t, live, `status = 'COMPLETED'`) == 20
	})
	if n := f.db.Count(t, `SELECT count(*) FROM job_events WHERE kind = 'reaped'`); n != 0 {
		t.Fatalf("%d reaped events, want 0: a live job was reaped", n)
	}

	// 200 jobs that really hang at once, and 50 more in another queue.
	hung := f.start(t, qHang, "b48.hang", 200)
	released := f.start(t, qRelease, "b48.hang", 50)
	var lastClaim time.Time
	if err := f.db.Pool.QueryRow(t.Context(), `SELECT max(started_at) FROM jobs WHERE queue = ANY($1)`,
		[]string{qHang, qRelease}).Scan(&lastClaim); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, b48StormAt+10*time.Second, "every hung job is past its stall timeout", func() bool {
		var idle time.Duration
		err := f.db.Pool.QueryRow(t.Context(), `SELECT now() - $1::timestamptz`, lastClaim).Scan(&idle)
		return err == nil && idle > b48Stall+time.Second
	})
	code, sum = f.pass(t, qRelease)
	if code != exitPassErrors || sum.StallStormHeld != 50 || sum.Reaped != 0 || len(sum.StallStormHolds) != 1 {
		t.Fatalf("first pass over %s: exit %d, %+v; want its 50 held", qRelease, code, sum)
	}
	code, sum = f.pass(t, qHang)
	if code != exitPassErrors || sum.StallStormHeld != 200 || sum.Reaped != 0 || len(sum.StallStormHolds) != 1 ||
		!sum.StallStormHolds[0].Started || sum.StallStormHolds[0].Tripped == "" {
		t.Fatalf("first pass over %s: exit %d, %+v; want its 200 held by a hold it started", qHang, code, sum)
	}
	hangHold := sum.StallStormHolds[0]

	r := run(t, "release-hold", "--reason", "B48: these hang for real", "--database-url", f.db.URL, "--schema", f.db.Schema,
		"--queues", qRelease)
	requireExit(t, r, exitOK)
	code, sum = f.pass(t, qRelease)
	if code != exitOK || sum.Reaped != 50 || sum.StallStormHeld != 0 {
		t.Fatalf("pass after release-hold: exit %d, %+v; want the 50 reaped at once", code, sum)
	}
	if n := f.count(t, released, `status = 'FAILED' AND failure_reason = 'stalled'`); n != 50 {
		t.Fatalf("%d of the 50 released jobs FAILED stalled, want 50", n)
	}

	for n := 1; ; n++ {
		if n > 2*int(b48Stall/time.Second) {
			t.Fatalf("the hold on %s did not end within two stall timeouts", qHang)
		}
		time.Sleep(time.Second)
		code, sum = f.pass(t, qHang)
		if len(sum.StallStormHolds) > 0 {
			if code != exitPassErrors || sum.Reaped != 0 || sum.StallStormHeld != 200 || sum.StallStormHolds[0].ID != hangHold.ID {
				t.Fatalf("pass %d during the hold on %s: exit %d, %+v; want the 200 held", n, qHang, code, sum)
			}
			continue
		}
		if code != exitOK || sum.Reaped != 200 || sum.Errors != 0 {
			t.Fatalf("first pass after the hold on %s: exit %d, %+v; want the 200 reaped together", qHang, code, sum)
		}
		break
	}
	if n := f.count(t, hung, `status = 'FAILED' AND failure_reason = 'stalled'`); n != 200 {
		t.Fatalf("%d of the 200 hung jobs FAILED stalled, want 200", n)
	}
	if n := f.db.Count(t, `SELECT count(*) FROM job_events e JOIN jobs j ON j.id = e.job_id WHERE e.kind = 'reaped' AND j.queue = $1`, qHang); n != 200 {
		t.Fatalf("%d reaped events for the 200 hung jobs, want one each", n)
	}
}
