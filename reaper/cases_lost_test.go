package reaper_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/jobreaper/jobreaper/internal/asynqstate"
	"github.com/jobreaper/jobreaper/internal/pgcore"
	"github.com/jobreaper/jobreaper/internal/pgstore"
	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
	"github.com/jobreaper/jobreaper/queue/queuetest"
	"github.com/jobreaper/jobreaper/reaper"
)

// serve runs an asynq server on rc for queues with handler, shut down at
// cleanup (or earlier by the returned func).
func serve(t *testing.T, rc redis.UniversalClient, queues []string, handler asynq.HandlerFunc, cfg asynq.Config) func() {
	t.Helper()
	cfg.Queues = map[string]int{}
	for _, q := range queues {
		cfg.Queues[q] = 1
	}
	cfg.LogLevel = asynq.FatalLevel
	cfg.Concurrency = max(cfg.Concurrency, 2)
	srv := asynq.NewServerFromRedisClient(rc, cfg)
	if err := srv.Start(handler); err != nil {
		t.Fatal(err)
	}
	var stopped atomic.Bool
	stop := func() {
		if stopped.CompareAndSwap(false, true) {
			srv.Shutdown()
		}
	}
	t.Cleanup(stop)
	return stop
}

// waitLive waits until a live server serves q in rc's database.
func waitLive(t *testing.T, rc redis.UniversalClient, q string) {
	t.Helper()
	reader := asynqstate.NewStatusReader(rc, 0)
	jobstest.Eventually(t, "a live server serves "+q, func() bool {
		live, err := reader.LiveQueues(context.Background())
		return err == nil && live[q]
	})
}

// retrying puts one task per ID of q into asynq's retry set the way asynq
// does it: a worker whose handler fails, with the next attempt an hour
// away; the worker is stopped afterwards (its processes "died").
func retrying(t *testing.T, rc redis.UniversalClient, q string, ids []string) {
	t.Helper()
	stop := serve(t, rc, []string{q}, func(context.Context, *asynq.Task) error { return errors.New("worker died") },
		asynq.Config{Concurrency: 20, RetryDelayFunc: func(int, error, *asynq.Task) time.Duration { return time.Hour }})
	client := asynq.NewClientFromRedisClient(rc)
	for _, id := range ids {
		if _, err := client.EnqueueContext(t.Context(), asynq.NewTask("report.export", nil), asynq.TaskID(id), asynq.Queue(q), asynq.MaxRetry(5)); err != nil {
			t.Fatal(err)
		}
	}
	insp := asynq.NewInspectorFromRedisClient(rc)
	jobstest.Eventually(t, fmt.Sprintf("%d tasks of %s wait in retry", len(ids), q), func() bool {
		info, err := insp.GetQueueInfo(q)
		return err == nil && info.Retry == len(ids)
	})
	stop()
}

// archived enqueues id's task in q and archives it, as asynq does with a
// task whose worker died on its last attempt.
func archived(t *testing.T, rc redis.UniversalClient, q, id string) {
	t.Helper()
	if _, err := asynq.NewClientFromRedisClient(rc).EnqueueContext(t.Context(), asynq.NewTask("report.export", nil),
		asynq.TaskID(id), asynq.Queue(q)); err != nil {
		t.Fatal(err)
	}
	if err := asynq.NewInspectorFromRedisClient(rc).ArchiveTask(q, id); err != nil {
		t.Fatal(err)
	}
}

// stalledRows inserts PROCESSING rows of q claimed 2 h ago and idle for
// idle, one per ID.
func stalledRows(t *testing.T, db *jobstest.DB, q string, idle time.Duration, ids ...string) {
	t.Helper()
	db.Exec(t, `INSERT INTO jobs (id, type, status, generation, queue, worker, started_at, updated_at)
SELECT id, 'report.export', 'PROCESSING', 1, nullif($2, ''), 'w-dead', now() - interval '2 hours', now() - $3::interval
  FROM unnest($1::text[]) AS id`, ids, q, pgcore.Interval(idle))
}

func idsOf(prefix string, n int) []string {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("%s-%04d", prefix, i)
	}
	return ids
}

// lostReaper is a daemon's Reaper on o's database reading asynq in rc.
func (o *ownRedis) lostReaper(t *testing.T, rc redis.UniversalClient, set func(*reaper.Options)) *reaper.Reaper {
	t.Helper()
	lister, err := asynqstate.NewIDLister(rc)
	if err != nil {
		t.Fatal(err)
	}
	return o.reaper(t, lister, func(opts *reaper.Options) {
		opts.Queues = nil
		opts.Asynq = asynqstate.NewStatusReader(rc, 0)
		if set != nil {
			set(opts)
		}
	})
}

func requireUntouched(t *testing.T, db *jobstest.DB, q string, n int) {
	t.Helper()
	if got := db.Count(t, `SELECT count(*) FROM jobs WHERE queue = $1 AND status = 'PROCESSING' AND generation = 1
   AND updated_at < now() - interval '1 hour'`, q); got != int64(n) {
		t.Fatalf("%d rows of %s are still PROCESSING and untouched, want %d", got, q, n)
	}
}

// B26: 2,000 stalled rows of imports wait in asynq's retry set (skipped as
// awaiting_retry), read first; J26 of exports, idle 1 h, has its task
// archived. The daemon reaps J26 as lost_task within ceil(2,001 / 500) = 5
// passes; the 2,000 rows stay PROCESSING, untouched; run --once looks at
// every candidate.
func TestCase_B26_SkippedCandidatesNeverHideALostJob(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	o := newOwnRedis(t)
	imports := idsOf("imp", 2000)
	retrying(t, o.rc, "imports", imports)
	stalledRows(t, o.db, "imports", 2*time.Hour, imports...)
	stalledRows(t, o.db, "exports", time.Hour, "J26")
	archived(t, o.rc, "exports", "J26")
	serve(t, o.rc, []string{"exports"}, func(context.Context, *asynq.Task) error { return nil }, asynq.Config{})
	waitLive(t, o.rc, "exports")

	r := o.lostReaper(t, o.rc, nil)
	limit := (2001 + pgstore.LostCandidatesLimitDefault - 1) / pgstore.LostCandidatesLimitDefault
	for pass := 1; o.db.Read(t, "J26").Status != jobs.StatusFailed; pass++ {
		if pass > limit {
			t.Fatalf("J26 is not reaped after %d passes", limit)
		}
		res, err := runOnce(t, ctx, r)
		if err != nil || res.Errors != 0 {
			t.Fatalf("pass %d = %+v, %v", pass, res, err)
		}
	}
	if row := o.db.Read(t, "J26"); row.FailureReason != jobs.ReasonLostTask {
		t.Fatalf("J26 = %+v, want FAILED lost_task", row)
	}
	requireUntouched(t, o.db, "imports", 2000)

	// run --once visits every candidate in its one pass.
	stalledRows(t, o.db, "exports", time.Hour, "J26b")
	archived(t, o.rc, "exports", "J26b")
	res, err := runOnce(t, ctx, o.lostReaper(t, o.rc, func(opts *reaper.Options) { opts.Once = true }))
	if err != nil || res.ReapedBy["lost_task"] != 1 || res.Skipped["awaiting_retry"] != 2000 {
		t.Fatalf("run --once = %+v, %v; want J26b reaped and 2,000 awaiting_retry", res, err)
	}
	requireUntouched(t, o.db, "imports", 2000)
}

// B27: Redis restarted empty; asynq no longer lists queue reports. J27
// (reports, started 2 h ago, idle 1 h, its worker dead) is held while no
// live server serves reports, then reaped as lost_task once one does. A
// row without a queue is counted as no_queue and never touched.
func TestCase_B27_QueueAsynqForgot(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	o := newOwnRedis(t)
	stalledRows(t, o.db, "reports", time.Hour, "J27")
	stalledRows(t, o.db, "", time.Hour, "J27-noqueue")
	if err := o.rc.FlushAll(ctx).Err(); err != nil { // the test's own server
		t.Fatal(err)
	}
	r := o.lostReaper(t, o.rc, nil)
	res, err := runOnce(t, ctx, r)
	if err != nil || res.Reaped != 0 || res.Skipped["lost_held"] != 1 || res.Skipped["no_queue"] != 1 {
		t.Fatalf("pass without a live server = %+v, %v; want J27 held and one no_queue", res, err)
	}
	if n := o.logs.count("no live asynq server serves their queue"); n != 1 {
		t.Fatalf("%d warnings about held jobs, want 1", n)
	}
	if row := o.db.Read(t, "J27"); row.Status != jobs.StatusProcessing {
		t.Fatalf("J27 = %+v, want PROCESSING while held", row)
	}
	// The workers come back and register their queues.
	serve(t, o.rc, []string{"reports"}, func(context.Context, *asynq.Task) error { return nil }, asynq.Config{})
	waitLive(t, o.rc, "reports")
	res, err = runOnce(t, ctx, r)
	if err != nil || res.ReapedBy["lost_task"] != 1 || res.Skipped["no_queue"] != 1 {
		t.Fatalf("pass with a live server = %+v, %v; want J27 reaped as lost_task", res, err)
	}
	if row := o.db.Read(t, "J27"); row.Status != jobs.StatusFailed || row.FailureReason != jobs.ReasonLostTask {
		t.Fatalf("J27 = %+v, want FAILED lost_task", row)
	}
	if n := o.db.Events(t, "J27", "reaped"); n != 1 {
		t.Fatalf("J27 reaped events = %d, want 1", n)
	}
	if row := o.db.Read(t, "J27-noqueue"); row.Status != jobs.StatusProcessing || row.Generation != 1 {
		t.Fatalf("the row without a queue = %+v, want untouched", row)
	}
}

// B29: --redis-url points at database 1. 300 stalled jobs (and 3 of
// another queue) whose tasks asynq holds in retry in database 0: in
// database 1 none exists and no live server serves their queue, so every
// one is held. Then Redis loses the tasks under live servers: the cycle
// would reap 300 > max_lost_per_pass (100), so it reaps none, an error,
// lost_limit_tripped and the metric; a stalled job whose task is active is
// reaped all the same; max_lost_per_pass 0 lifts the limit.
func TestCase_B29_WrongRedisLooksLikeAMassLoss(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	o := newOwnRedis(t)
	many, few := idsOf("m29", 300), idsOf("f29", 3)
	retrying(t, o.rc, "q29", many)
	retrying(t, o.rc, "q29-few", few)
	stalledRows(t, o.db, "q29", time.Hour, many...)
	stalledRows(t, o.db, "q29-few", time.Hour, few...)
	serve(t, o.rc, []string{"q29", "q29-few"}, func(context.Context, *asynq.Task) error { return nil }, asynq.Config{})
	waitLive(t, o.rc, "q29")

	db1 := redis.NewClient(&redis.Options{Addr: o.srv.Addr, DB: 1, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = db1.Close() })
	res, err := runOnce(t, ctx, o.lostReaper(t, db1, func(opts *reaper.Options) { opts.Once, opts.MaxLostPerPass = true, 100 }))
	if err != nil || res.Reaped != 0 || res.Skipped["lost_held"] != 303 || res.LostLimitTripped {
		t.Fatalf("pass on database 1 = %+v, %v; want all 303 held, none reaped", res, err)
	}
	if n := o.logs.count("wrong Redis address or database"); n != 2 {
		t.Fatalf("%d held warnings naming the likely causes, want one per queue (2)", n)
	}
	requireUntouched(t, o.db, "q29", 300)

	// Redis loses the tasks while the workers stay live.
	if err := o.rc.FlushDB(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	waitLive(t, o.rc, "q29")
	// A stalled job whose task is active: never held back by either guard.
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	serve(t, o.rc, []string{"q29-active"}, func(ctx context.Context, _ *asynq.Task) error {
		select {
		case <-release:
		case <-ctx.Done():
		}
		return nil
	}, asynq.Config{})
	stalledRows(t, o.db, "q29-active", time.Hour, "J29-active")
	if _, err := asynq.NewClientFromRedisClient(o.rc).EnqueueContext(ctx, asynq.NewTask("report.export", nil),
		asynq.TaskID("J29-active"), asynq.Queue("q29-active")); err != nil {
		t.Fatal(err)
	}
	insp := asynq.NewInspectorFromRedisClient(o.rc)
	jobstest.Eventually(t, "J29-active's task is active", func() bool {
		info, err := insp.GetTaskInfo("q29-active", "J29-active")
		return err == nil && info.State == asynq.TaskStateActive
	})
	// A dry run says what the real pass will do: no lost_task reap.
	res, err = runOnce(t, ctx, o.lostReaper(t, o.rc, func(opts *reaper.Options) { opts.Once, opts.MaxLostPerPass, opts.DryRun = true, 100, true }))
	if err != nil || !res.LostLimitTripped || res.ReapedBy["lost_task"] != 0 {
		t.Fatalf("dry run after the loss = %+v, %v; want the limit tripped and no lost_task reap", res, err)
	}
	held := 0
	for _, d := range res.Decisions {
		if d.Decision == reaper.DecisionReap && d.Reason == "lost_task" {
			t.Fatalf("dry run decision %+v says reap lost_task although the limit holds every one back", d)
		}
		if d.Reason == string(reaper.SkipLostLimit) {
			held++
		}
	}
	if held != 303 {
		t.Fatalf("%d dry-run decisions held by the limit, want 303", held)
	}
	requireUntouched(t, o.db, "q29", 300)

	res, err = runOnce(t, ctx, o.lostReaper(t, o.rc, func(opts *reaper.Options) { opts.Once, opts.MaxLostPerPass = true, 100 }))
	if err != nil || !res.LostLimitTripped || res.Errors == 0 || res.ReapedBy["lost_task"] != 0 || res.ReapedBy["stalled"] != 1 {
		t.Fatalf("pass after the loss = %+v, %v; want the limit tripped, no lost_task reap, J29-active reaped as stalled", res, err)
	}
	if n := o.logs.count("Redis was flushed"); n != 2 { // the dry run's and the real pass's
		t.Fatalf("%d errors naming the likely causes, want 2 (one a pass)", n)
	}
	if got := metricValue(t, o.reg, "jobreaper_lost_limit_tripped_total", nil); got != 2 {
		t.Fatalf("jobreaper_lost_limit_tripped_total = %v, want 2 (one a pass)", got)
	}
	requireUntouched(t, o.db, "q29", 300)

	// An operator who checked lifts the limit.
	res, err = runOnce(t, ctx, o.lostReaper(t, o.rc, func(opts *reaper.Options) { opts.Once, opts.MaxLostPerPass = true, 0 }))
	if err != nil || res.ReapedBy["lost_task"] != 303 || res.LostLimitTripped {
		t.Fatalf("pass without a limit = %+v, %v; want all 303 reaped as lost_task", res, err)
	}
	if got := o.db.Count(t, `SELECT count(*) FROM jobs WHERE status = 'FAILED' AND failure_reason = 'lost_task' AND id LIKE ANY ('{m29-%,f29-%}')`); got != 303 {
		t.Fatalf("%d lost_task rows, want 303", got)
	}
}

// Broken active entries (item 8 of the reconcile work): one whose task
// hash is gone, one without a lease. Both are counted per queue
// (broken_active, jobreaper_broken_active_entries{queue}), never written
// to, and their stalled jobs are reaped as lost_task while a live server
// serves the queue; the sound active entry's stalled job is reaped as
// stalled.
func TestBrokenActiveEntriesAreCountedAndTheirStalledJobsReapedAsLost(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	o := newOwnRedis(t)
	q := "b8"
	ids := []string{"J-ok", "J-nohash", "J-nolease"}
	if err := queuetest.MakeActive(ctx, o.rc, q, "report.export", ids); err != nil {
		t.Fatal(err)
	}
	if err := o.rc.Del(ctx, "asynq:{"+q+"}:t:J-nohash").Err(); err != nil {
		t.Fatal(err)
	}
	if err := o.rc.ZRem(ctx, "asynq:{"+q+"}:lease", "J-nolease").Err(); err != nil {
		t.Fatal(err)
	}
	stalledRows(t, o.db, q, time.Hour, ids...)
	serve(t, o.rc, []string{q}, func(context.Context, *asynq.Task) error { return nil }, asynq.Config{})
	waitLive(t, o.rc, q)
	before, err := o.rc.LRange(ctx, "asynq:{"+q+"}:active", 0, -1).Result()
	if err != nil {
		t.Fatal(err)
	}

	cancels := &recordingCanceller{}
	res, err := runOnce(t, ctx, o.lostReaper(t, o.rc, func(opts *reaper.Options) { opts.Once, opts.Canceller = true, cancels }))
	if err != nil || res.BrokenActive != 2 || res.Scanned != 3 || res.ReapedBy["stalled"] != 1 || res.ReapedBy["lost_task"] != 2 {
		t.Fatalf("pass = %+v, %v; want 2 broken entries, J-ok stalled, the other two lost_task", res, err)
	}
	// The handlers of the broken entries may still run (their tasks are
	// listed active): every reaped job's handler is cancelled, lost ones
	// too, not only the stalled one.
	if got := cancels.sorted(); !slices.Equal(got, []string{"J-nohash", "J-nolease", "J-ok"}) {
		t.Fatalf("cancels published for %v, want all three reaped jobs", got)
	}
	if got := metricValue(t, o.reg, "jobreaper_broken_active_entries", map[string]string{"queue": q}); got != 2 {
		t.Fatalf("jobreaper_broken_active_entries{queue=%s} = %v, want 2", q, got)
	}
	for id, reason := range map[string]string{"J-ok": jobs.ReasonStalled, "J-nohash": jobs.ReasonLostTask, "J-nolease": jobs.ReasonLostTask} {
		if row := o.db.Read(t, id); row.Status != jobs.StatusFailed || row.FailureReason != reason {
			t.Fatalf("%s = %+v, want FAILED %s", id, row, reason)
		}
	}
	after, err := o.rc.LRange(ctx, "asynq:{"+q+"}:active", 0, -1).Result()
	if err != nil || !slices.Equal(after, before) {
		t.Fatalf("asynq's active list changed: %v -> %v (%v); jobreaper never writes asynq's keys", before, after, err)
	}
}

// recordingCanceller records the job IDs whose handlers a pass cancels.
type recordingCanceller struct {
	mu  sync.Mutex
	ids []string
}

func (c *recordingCanceller) Cancel(_ context.Context, ids []string) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.ids = append(c.ids, ids...)
	return len(ids), nil
}

func (c *recordingCanceller) sorted() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Sorted(slices.Values(c.ids))
}

// Under a mass-loss limit a lost job is judged twice, when the cycle finds
// it and when its task is looked up again before the reap; it is logged
// once, when it is reaped.
func TestLostJobIsLoggedOnceUnderAMassLossLimit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	o := newOwnRedis(t)
	lost := idsOf("log", 3)
	stalledRows(t, o.db, "q-log", time.Hour, lost...)
	serve(t, o.rc, []string{"q-log"}, func(context.Context, *asynq.Task) error { return nil }, asynq.Config{})
	waitLive(t, o.rc, "q-log")
	res, err := runOnce(t, ctx, o.lostReaper(t, o.rc, func(opts *reaper.Options) { opts.Once, opts.MaxLostPerPass = true, 10 }))
	if err != nil || res.ReapedBy["lost_task"] != 3 || res.LostLimitTripped || res.Errors != 0 {
		t.Fatalf("pass = %+v, %v; want the 3 jobs reaped as lost_task under the limit", res, err)
	}
	if n := o.logs.count("stalled job's task will never run again"); n != 3 {
		t.Fatalf("%d lines saying a task will never run again, want one per lost job (3)", n)
	}
}
