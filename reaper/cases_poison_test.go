package reaper_test

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/jobreaper/jobreaper/internal/asynqstate"
	"github.com/jobreaper/jobreaper/internal/pgstore"
	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
	"github.com/jobreaper/jobreaper/queue"
	"github.com/jobreaper/jobreaper/reaper"
)

// realAsynq is one test's share of the real Redis: queues and job IDs
// unique to the test, removed at cleanup, and an asynq server whose
// handlers block until the test ends so that their tasks stay active.
type realAsynq struct {
	rc     *redis.Client
	client *asynq.Client
	insp   *asynq.Inspector
	suffix string
}

func newRealAsynq(t *testing.T) *realAsynq {
	t.Helper()
	addr := cmp.Or(os.Getenv("JOBREAPER_TEST_REDIS_ADDR"), "127.0.0.1:6379")
	rc := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = rc.Close() })
	if err := rc.Ping(t.Context()).Err(); err != nil {
		t.Fatalf("Redis for tests is not reachable at %s (%v); start it (bash .ci/services.sh) or set JOBREAPER_TEST_REDIS_ADDR", addr, err)
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	return &realAsynq{rc: rc, client: asynq.NewClientFromRedisClient(rc), insp: asynq.NewInspectorFromRedisClient(rc),
		suffix: hex.EncodeToString(b[:])}
}

// serveBlocking runs an asynq server on queues whose handler holds each
// task until its context ends, and removes the queues (their tasks) and
// the markers of markerIDs at cleanup, after the server stopped.
func (a *realAsynq) serveBlocking(t *testing.T, queues []string, markerIDs ...string) {
	t.Helper()
	t.Cleanup(func() {
		for _, q := range queues {
			_ = a.insp.DeleteQueue(q, true)
		}
		for _, id := range markerIDs {
			a.rc.Del(context.Background(), queue.MarkerKey(id))
		}
	})
	weights := map[string]int{}
	for _, q := range queues {
		weights[q] = 1
	}
	srv := asynq.NewServerFromRedisClient(a.rc, asynq.Config{Queues: weights, Concurrency: 10,
		LogLevel: asynq.FatalLevel, ShutdownTimeout: time.Second})
	if err := srv.Start(asynq.HandlerFunc(func(ctx context.Context, _ *asynq.Task) error {
		<-ctx.Done()
		return ctx.Err()
	})); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
}

// activate enqueues a task with each ID into q and waits until asynq lists
// them all as active.
func (a *realAsynq) activate(t *testing.T, q string, ids ...string) {
	t.Helper()
	for _, id := range ids {
		if _, err := a.client.EnqueueContext(t.Context(), asynq.NewTask("report.export", nil), asynq.TaskID(id), asynq.Queue(q)); err != nil {
			t.Fatalf("enqueueing %q: %v", id, err)
		}
	}
	jobstest.Eventually(t, "the tasks of "+q+" are active", func() bool {
		got, err := a.insp.ListActiveTasks(q)
		return err == nil && len(got) == len(ids)
	})
}

// B33: another producer sharing the Redis enqueued a task whose ID holds a
// NUL byte; it sits in an active list the daemon scans. Two jobs in other
// queues are stalled. Both are reaped in the next pass, and the odd ID is
// counted as a skip with its own reason, never sent to PostgreSQL.
func TestCase_B33_OddTaskIDDoesNotStopTheReaps(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := jobstest.New(t)
	db.JobType(t, "report.export", "30 minutes", "", "")
	a := newRealAsynq(t)
	qOdd, qB, qC := "b33-odd-"+a.suffix, "b33-b-"+a.suffix, "b33-c-"+a.suffix
	odd, jB, jC := "odd\x00"+a.suffix, "J33b-"+a.suffix, "J33c-"+a.suffix
	a.serveBlocking(t, []string{qOdd, qB, qC}, jB, jC)
	for id, q := range map[string]string{jB: qB, jC: qC} {
		db.Insert(t, jobstest.Job{ID: id, Type: "report.export", Generation: 1, Queue: q,
			StartedAgo: jobstest.Ago(31 * time.Minute), IdleAgo: 21 * time.Minute})
	}
	a.activate(t, qOdd, odd)
	a.activate(t, qB, jB)
	a.activate(t, qC, jC)

	lister, err := asynqstate.NewInspectorLister(a.insp)
	if err != nil {
		t.Fatal(err)
	}
	markers := newMarkers(t, a.rc)
	reg := prometheus.NewRegistry()
	r := reaper.New(db.Daemon(), lister, markers, reaper.Options{
		Queues: []string{qOdd, qB, qC}, Rule: baselineRule, Logger: testLogger(t), Metrics: reaper.NewMetrics(reg),
	})
	res, err := runOnce(t, ctx, r)
	if err != nil || res.Reaped != 2 || res.Errors != 0 || res.Scanned != 3 || !equalCounts(res.Skipped, map[string]int{"bad_job_id": 1}) {
		t.Fatalf("result = %+v, err = %v; want 3 scanned, both stalled jobs reaped, the odd ID skipped as bad_job_id, no errors", res, err)
	}
	for _, id := range []string{jB, jC} {
		if row := db.Read(t, id); row.Status != jobs.StatusFailed || row.FailureReason != jobs.ReasonStalled {
			t.Fatalf("%s = %+v, want FAILED stalled", id, row)
		}
		if g, found, err := markers.Get(ctx, id); err != nil || !found || g != 1 {
			t.Fatalf("marker of %s: generation %d, found %v, err %v; want generation 1", id, g, found, err)
		}
	}
	if got := metricValue(t, reg, "jobreaper_jobs_skipped_total", map[string]string{"reason": "bad_job_id"}); got != 1 {
		t.Fatalf("jobreaper_jobs_skipped_total{reason=bad_job_id} = %v, want 1", got)
	}
	if got := metricValue(t, reg, "jobreaper_pass_errors_total", map[string]string{"stage": "load"}); got != 0 {
		t.Fatalf("load errors = %v, want 0", got)
	}
}

// failingLoadStore fails the load of every batch that holds one of its
// IDs, as PostgreSQL does for a batch holding an ID it cannot store.
type failingLoadStore struct {
	*pgstore.Store
	poison string
}

func (s *failingLoadStore) LoadForTasks(ctx context.Context, ids []string) (map[string]jobs.Snapshot, error) {
	if slices.Contains(ids, s.poison) {
		return nil, errors.New(`ERROR: invalid byte sequence for encoding "UTF8": 0x00 (SQLSTATE 22021)`)
	}
	return s.Store.LoadForTasks(ctx, ids)
}

// B33: a failed load of one batch never stops the other batches or the
// lost-task search. Loads of one ID each: the batch of J2 fails; J1 and J3
// (stalled, active) and J4 (stalled, its task gone) are reaped in the same
// pass, and the failure is one error at stage load.
func TestCase_B33_FailedBatchLoadStopsNeitherOtherBatchesNorTheLostTaskSearch(t *testing.T) {
	t.Parallel()
	b := setup(t, func(o *reaper.Options) { o.LoadBatch = 1 })
	for _, id := range []string{"J1", "J2", "J3", "J4"} {
		b.stalled(t, id)
	}
	b.lister.queues["default"] = asynqstate.ActiveTasks{IDs: []string{"J1", "J2", "J3"}}
	r := reaper.New(&failingLoadStore{Store: b.db.Daemon(), poison: "J2"}, b.lister, b.markers,
		reaper.Options{Rule: baselineRule, Logger: testLogger(t), Metrics: b.metrics, LoadBatch: 1})
	res, err := runOnce(t, context.Background(), r)
	if err != nil || res.Reaped != 3 || res.ReapedBy["stalled"] != 2 || res.ReapedBy["lost_task"] != 1 || res.Errors != 1 {
		t.Fatalf("result = %+v, err = %v; want J1, J3 reaped as stalled, J4 as lost_task, one error", res, err)
	}
	for id, want := range map[string]string{"J1": jobs.StatusFailed, "J2": jobs.StatusProcessing, "J3": jobs.StatusFailed, "J4": jobs.StatusFailed} {
		if row := b.db.Read(t, id); row.Status != want {
			t.Fatalf("%s = %+v, want %s", id, row, want)
		}
	}
	if got := metricValue(t, b.reg, "jobreaper_pass_errors_total", map[string]string{"stage": "load"}); got != 1 {
		t.Fatalf("load errors = %v, want 1", got)
	}
}
