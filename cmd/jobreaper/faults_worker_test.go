package main

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
	"github.com/jobreaper/jobreaper/queue"
	"github.com/jobreaper/jobreaper/queue/redistest"
)

// killPointIn draws where an attempt that resumes at cursor stops: one of
// the next three batches, with its rows written and its transaction open,
// or just committed (never the last batch committed, so that every
// attempt has a batch left to be killed in). It returns the point
// (envFaultWorkerKillAt's format) and the cursor the job must have once
// the attempt is killed there.
func killPointIn(rng *rand.Rand, cursor int64) (string, int64) {
	last := int64(faultItems/faultBatch - 1)
	k := cursor/faultBatch + rng.Int64N(min(3, last-cursor/faultBatch+1))
	if k == last || rng.IntN(2) == 0 {
		return fmt.Sprintf("%d:written", k), k * faultBatch
	}
	return fmt.Sprintf("%d:committed", k), (k + 1) * faultBatch
}

// A worker process is killed with SIGKILL in the middle of a batch of
// resumable progress (its rows written, its transaction open) or just
// after one: attempts of job W-resumed, which has retries left, are
// killed by the first workerKills worker processes, each at a random
// batch; asynq's recoverer retries it (its lease made expired, as
// time passing would), the next worker process resumes at the cursor, and
// the last one completes it: every item written once, by the attempt
// that recorded its batch, the cursor never moved backwards. Job W-lost,
// killed on its only attempt by the first kill, is archived by asynq and
// reaped as lost_task once the stall rule holds, with its cascade and
// marker, its cursor and rows as the kill left them.
func TestReliabilityFaults_WorkerSIGKILLMidBatch(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	rng := faultRand(t)
	workerKills := faultServiceRounds(t) - 1
	f := newFaultFixture(t)
	f.db.Exec(t, `CREATE TABLE items (job_id text, item bigint, generation bigint NOT NULL, PRIMARY KEY (job_id, item))`)
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	store := f.db.Store()
	resumed, lost := "W-resumed", "W-lost"
	var violations atomic.Int64
	kills, rowsLost := 0, 0
	defer func() {
		jobstest.Figure(t, faultSuite, "worker_sigkill", kills)
		jobstest.Figure(t, faultSuite, "violations", int(violations.Load()))
		jobstest.Figure(t, faultSuite, "rows_lost", rowsLost)
	}()
	client := asynq.NewClientFromRedisClient(rdb)
	total := int64(faultItems)
	for id, retries := range map[string]int{resumed: workerKills, lost: 0} {
		f.db.Insert(t, jobstest.Job{ID: id, Type: "report.export", Status: jobs.StatusQueued, Queue: faultQueue, Total: &total})
		if _, err := queue.Enqueue(ctx, client, store, asynq.NewTask("report.export", nil), id, asynq.MaxRetry(retries)); err != nil {
			t.Fatal(err)
		}
	}
	// requireProgress checks a killed attempt's job: still PROCESSING at
	// its generation, the cursor where the kill point left it, one row
	// per item below the cursor and none above, each written by the
	// generation that recorded its batch.
	requireProgress := func(id string, generation, cursor int64, what string) {
		t.Helper()
		row := f.db.Read(t, id)
		items := f.db.Count(t, `SELECT count(*) FROM items WHERE job_id = $1`, id)
		below := f.db.Count(t, `SELECT count(*) FROM items WHERE job_id = $1 AND item < $2`, id, row.Cursor)
		foreign := f.db.Count(t, `SELECT count(*) FROM items i JOIN `+f.db.Table("job_batches")+` b
    ON b.job_id = i.job_id AND b.token = 'batch-' || (i.item / $2)
 WHERE i.job_id = $1 AND b.generation <> i.generation`, id, faultBatch)
		if row.Status != jobs.StatusProcessing || row.Generation != generation || row.Cursor != cursor ||
			items != row.Cursor || below != row.Cursor || foreign != 0 {
			violations.Add(1)
			t.Errorf("after %s: %s = %+v with %d item rows (%d below its cursor, %d not written by the generation that recorded their batch); "+
				"want PROCESSING at generation %d, cursor %d, one row per item below it", what, id, row, items, below, foreign, generation, cursor)
		}
		if below < row.Cursor {
			rowsLost += int(row.Cursor - below)
		}
	}
	// expireLeases makes the killed attempts' asynq leases expired by
	// over a minute, as time passing after the kill would (asynq's
	// recoverer takes tasks whose 30 s lease expired 30 s ago), so that
	// the next worker process's recoverer, which runs at its start, takes
	// them.
	expireLeases := func(ids ...string) {
		t.Helper()
		past := float64(time.Now().Add(-2 * time.Minute).Unix())
		for _, id := range ids {
			n, err := rdb.ZAddXX(ctx, "asynq:{"+faultQueue+"}:lease", redis.Z{Score: past, Member: id}).Result()
			if err != nil {
				t.Fatal(err)
			}
			_ = n // ZADD XX answers 0 for an updated member
			if s, err := rdb.ZScore(ctx, "asynq:{"+faultQueue+"}:lease", id).Result(); err != nil || s != past {
				t.Fatalf("the lease of %s: %v, %v; want it moved back", id, s, err)
			}
		}
	}

	cursor := int64(0)
	var cursors []int64
	for attempt := 1; attempt <= workerKills; attempt++ {
		at, want := killPointIn(rng, cursor)
		killAt := resumed + "=" + at
		var lostAt string
		var lostWant int64
		if attempt == 1 {
			lostAt, lostWant = killPointIn(rng, 0)
			killAt += "," + lost + "=" + lostAt
		}
		name := fmt.Sprintf("w-fault-%d", attempt)
		w := startWorkerChild(t, f, srv, name, killAt, &violations)
		w.await(t, "reached "+resumed)
		if attempt == 1 {
			w.await(t, "reached "+lost)
		}
		w.kill(t)
		kills++
		what := fmt.Sprintf("SIGKILL %d of worker %s (%s at batch %s)", kills, name, resumed, at)
		requireProgress(resumed, int64(attempt), want, what)
		if want < cursor {
			violations.Add(1)
			t.Errorf("after %s: the cursor moved backwards from %d to %d", what, cursor, want)
		}
		cursor = want
		cursors = append(cursors, cursor)
		expireLeases(resumed)
		if attempt == 1 {
			requireProgress(lost, 1, lostWant, what+" and "+lost+" at batch "+lostAt)
			expireLeases(lost)
		}
		violations.Add(int64(f.checkReaps(t, what)))
	}
	t.Logf("%s's cursor after each kill: %v", resumed, cursors)

	// The last worker process resumes W-resumed and completes it. It
	// stays up: the live asynq server of the queue, without which a
	// lost_task reap is held.
	w := startWorkerChild(t, f, srv, "w-fault-last", "", &violations)
	w.await(t, "completed "+resumed)
	row := f.db.Read(t, resumed)
	items := f.db.Count(t, `SELECT count(*) FROM items WHERE job_id = $1`, resumed)
	if row.Status != jobs.StatusCompleted || row.Cursor != faultItems || row.Generation != int64(workerKills+1) || items != faultItems {
		violations.Add(1)
		t.Errorf("%s = %+v with %d item rows; want COMPLETED at generation %d, cursor %d, %d rows", resumed, row, items, workerKills+1, faultItems, faultItems)
	}
	rowsLost += faultItems - int(items)
	if n := f.db.Count(t, `SELECT count(*) FROM `+f.db.Table("job_batches")+` WHERE job_id = $1`, resumed); n != faultItems/faultBatch {
		violations.Add(1)
		t.Errorf("%s has %d recorded batches, want %d", resumed, n, faultItems/faultBatch)
	}

	// W-lost: archived by the first recoverer after its kill; the pass
	// after the stall rule holds reaps it as lost_task.
	insp := asynq.NewInspectorFromRedisClient(rdb)
	waitUntil(t, faultWait, "asynq archives "+lost, func() bool {
		info, err := insp.GetTaskInfo(faultQueue, lost)
		return err == nil && info.State == asynq.TaskStateArchived
	})
	before := f.db.Read(t, lost)
	f.db.Exec(t, `UPDATE jobs SET started_at = now() - interval '31 minutes', updated_at = now() - interval '21 minutes' WHERE id = $1`, lost)
	r := run(t, "run", "--once", "--output", "json", "--config", f.config, "--database-url", f.db.URL, "--schema", f.db.Schema,
		"--redis-url", srv.URL, "--queues", faultQueue)
	requireExit(t, r, exitOK)
	if !strings.Contains(r.stdout, `"reaped_by":{"lost_task":1,"stalled":0}`) {
		violations.Add(1)
		t.Errorf("the pass after the stall rule holds: %s; want %s reaped as lost_task", r.stdout, lost)
	}
	after := f.db.Read(t, lost)
	lostItems := f.db.Count(t, `SELECT count(*) FROM items WHERE job_id = $1`, lost)
	if after.Status != jobs.StatusFailed || after.FailureReason != jobs.ReasonLostTask || after.Cursor != before.Cursor || lostItems != before.Cursor {
		violations.Add(1)
		t.Errorf("%s = %+v with %d item rows; want FAILED lost_task, cursor %d and its rows kept", lost, after, lostItems, before.Cursor)
	}
	violations.Add(int64(f.checkReaps(t, "the lost_task reap") + f.checkMarkers(t, rdb, lost, "the lost_task reap")))
}
