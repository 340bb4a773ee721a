package reaper_test

import (
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/redis/go-redis/v9"

	"github.com/jobreaper/jobreaper/internal/asynqstate"
	"github.com/jobreaper/jobreaper/internal/fleettest"
	"github.com/jobreaper/jobreaper/internal/pgcore"
	"github.com/jobreaper/jobreaper/internal/pgstore"
	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
	"github.com/jobreaper/jobreaper/queue"
	"github.com/jobreaper/jobreaper/queue/queuetest"
	"github.com/jobreaper/jobreaper/reaper"
)

// The Scale benchmarks measure a pass against its floor in the same run,
// interleaved iteration by iteration so that a machine shared with other
// work slows both alike. Each reports medians as custom metrics, which
// .ci/bench turns into one table. They need the real PostgreSQL and Redis;
// jobs also holds 10 finished rows for every active one, as a production
// table is mostly history.

// scaleQueues is how many asynq queues the active tasks are spread over.
const scaleQueues = 10

// historyPerActive is how many finished rows jobs holds per active task.
const historyPerActive = 10

// scaleWorld is one benchmark's jobs table, active tasks and reaper.
type scaleWorld struct {
	db     *jobstest.DB
	rdb    *redis.Client
	queues []string
	ids    []string
	store  *pgstore.Store
	reaper *reaper.Reaper
}

// newScaleWorld builds n active tasks over scaleQueues queues with a
// PROCESSING row each, started startedAgo and last moved idleAgo, plus the
// finished history; parent_id spreads the rows over n/100 parents.
func newScaleWorld(b *testing.B, n int, startedAgo, idleAgo time.Duration, cascades jobs.Cascades) *scaleWorld {
	b.Helper()
	ctx := context.Background()
	w := &scaleWorld{db: jobstest.New(b)}
	addr := cmp.Or(os.Getenv("JOBREAPER_TEST_REDIS_ADDR"), "127.0.0.1:6379")
	w.rdb = redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
	b.Cleanup(func() { _ = w.rdb.Close() })
	var sfx [4]byte
	_, _ = rand.Read(sfx[:])
	prefix := "bench-" + hex.EncodeToString(sfx[:])
	for i := range scaleQueues {
		w.queues = append(w.queues, fmt.Sprintf("%s-q%d", prefix, i))
	}
	w.db.JobType(b, "bench.task", "30 minutes", "", "")
	w.db.Exec(b, `CREATE TABLE parents (id text PRIMARY KEY, failed bigint NOT NULL DEFAULT 0)`)
	w.db.Exec(b, `INSERT INTO parents (id) SELECT 'P' || i FROM generate_series(0, $1) AS i`, n/100)
	w.db.Exec(b, `INSERT INTO jobs (id, type, status, generation, worker, queue, parent_id, started_at, updated_at)
SELECT $1 || '-' || lpad(i::text, 7, '0'), 'bench.task', 'PROCESSING', 1, 'w1', $1 || '-q' || (i % $2), 'P' || (i / 100),
       now() - $3::interval, now() - $4::interval
  FROM generate_series(0, $5 - 1) AS i`, prefix, scaleQueues, pgcore.Interval(startedAgo), pgcore.Interval(idleAgo), n)
	w.db.Exec(b, `INSERT INTO jobs (id, type, status, generation, worker, queue, started_at, updated_at, finished_at, marker_set_at, failure_reason)
SELECT 'done-' || lpad(i::text, 8, '0'), 'bench.task', CASE WHEN i % 20 = 0 THEN 'FAILED' ELSE 'COMPLETED' END, 1, 'w1',
       $1 || '-q' || (i % $2), now() - interval '2 days', now() - interval '2 days', now() - interval '2 days',
       CASE WHEN i % 20 = 0 THEN now() - interval '2 days' END, CASE WHEN i % 20 = 0 THEN 'stalled' END
  FROM generate_series(0, $3 - 1) AS i`, prefix, scaleQueues, n*historyPerActive)
	w.db.Exec(b, `VACUUM ANALYZE jobs`)
	w.ids = make([]string, n)
	perQueue := make([][]string, scaleQueues)
	for i := range w.ids {
		w.ids[i] = fmt.Sprintf("%s-%07d", prefix, i)
		perQueue[i%scaleQueues] = append(perQueue[i%scaleQueues], w.ids[i])
	}
	b.Cleanup(func() {
		for _, q := range w.queues {
			_ = queuetest.Remove(context.Background(), w.rdb, q)
		}
		w.deleteMarkers(b)
		w.deleteHistoryMarkers(b, n*historyPerActive)
	})
	for i, q := range w.queues {
		if err := queuetest.MakeActive(ctx, w.rdb, q, "bench.task", perQueue[i]); err != nil {
			b.Fatal(err)
		}
	}
	w.store = w.db.Daemon(pgstore.WithCascades(cascades))
	lister, err := asynqstate.NewIDLister(w.rdb)
	if err != nil {
		b.Fatal(err)
	}
	markers := asynqstate.NewMarkerWriter(w.rdb, 0)
	w.reaper = reaper.New(w.store, lister, markers, reaper.Options{
		Queues: w.queues, Rule: baselineRule,
		Logger: slog.New(slog.NewTextHandler(io.Discard, &slog.HandlerOptions{Level: slog.LevelInfo})),
	})
	return w
}

// deleteHistoryMarkers deletes the markers a pass restored for the FAILED
// rows of the finished history (they have marker_set_at but no marker in
// Redis until a pass re-asserts them), so that no benchmark leaves keys
// behind in the shared Redis.
func (w *scaleWorld) deleteHistoryMarkers(b *testing.B, n int) {
	for start := 0; start < n; start += 1000 {
		keys := make([]string, 0, 1000)
		for i := start; i < min(start+1000, n); i++ {
			keys = append(keys, queue.MarkerKey(fmt.Sprintf("done-%08d", i)))
		}
		if err := w.rdb.Del(context.Background(), keys...).Err(); err != nil {
			b.Fatal(err)
		}
	}
}

func (w *scaleWorld) deleteMarkers(b *testing.B) {
	for start := 0; start < len(w.ids); start += 1000 {
		keys := make([]string, 0, 1000)
		for _, id := range w.ids[start:min(start+1000, len(w.ids))] {
			keys = append(keys, queue.MarkerKey(id))
		}
		if err := w.rdb.Del(context.Background(), keys...).Err(); err != nil {
			b.Fatal(err)
		}
	}
}

// floor is the least a pass over the active tasks can do: list the IDs
// raw (LLEN, then LRANGE chunks of 1,000 in one pipeline, per queue) and
// load their rows and limits with a custom plan (an unnamed statement,
// batches of 10,000), reading every column and keeping nothing. It returns
// how many rows it read.
func (w *scaleWorld) floor(ctx context.Context) (int, error) {
	var ids []string
	for _, q := range w.queues {
		key := "asynq:{" + q + "}:active"
		n, err := w.rdb.LLen(ctx, key).Result()
		if err != nil {
			return 0, err
		}
		cmds, err := w.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			for start := int64(0); start < n; start += 1000 {
				p.LRange(ctx, key, start, start+999)
			}
			return nil
		})
		if err != nil {
			return 0, err
		}
		for _, c := range cmds {
			ids = append(ids, c.(*redis.StringSliceCmd).Val()...)
		}
	}
	schema := pgx.Identifier{w.db.Schema}.Sanitize()
	sql := `SELECT j.id, j.type, j.status, j.generation, coalesce(j.worker, ''), coalesce(j.queue, ''),
       coalesce(j.parent_id, ''), j.started_at, j.updated_at, coalesce(j.failure_reason, ''),
       t.name IS NOT NULL, t.max_runtime, t.stall_timeout, t.hard_timeout, coalesce(t.auto_complete, false)
  FROM ` + schema + `.jobs j LEFT JOIN ` + schema + `.job_types t ON t.name = j.type
 WHERE j.id = ANY($1)`
	read := 0
	for start := 0; start < len(ids); start += pgstore.LoadBatchSize {
		rows, err := w.db.Pool.Query(ctx, sql, pgx.QueryExecModeExec, ids[start:min(start+pgstore.LoadBatchSize, len(ids))])
		if err != nil {
			return 0, err
		}
		for rows.Next() {
			if _, err := rows.Values(); err != nil {
				rows.Close()
				return 0, err
			}
			read++
		}
		if err := rows.Err(); err != nil {
			return 0, err
		}
	}
	return read, nil
}

// median returns the median of ds in milliseconds.
func median(ds []time.Duration) float64 {
	s := slices.Clone(ds)
	slices.Sort(s)
	m := s[len(s)/2]
	if len(s)%2 == 0 {
		m = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return float64(m) / float64(time.Millisecond)
}

// allocsDuring returns the bytes and objects fn allocated.
func allocsDuring(fn func()) (bytes, objects uint64) {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	fn()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc, after.Mallocs - before.Mallocs
}

// BenchmarkScalePass measures a pass with nothing to reap over n active
// tasks against the floor of the same n, interleaved, and the whole
// `jobreaper run --once` process (start-up included) with its peak RSS.
// Metrics: floor-ms, pass-ms and pass/floor are medians; process-ms and
// peak-RSS-MiB come from the real binary; pass-B and pass-allocs are the
// pass's own allocations (the harness's B/op covers floor + pass + the
// process's pipes).
func BenchmarkScalePass(b *testing.B) {
	bin := fleettest.BuildJobreaperRelease(b)
	for _, n := range []int{1000, 20000, 100000} {
		b.Run(fmt.Sprintf("N=%d", n), func(b *testing.B) {
			w := newScaleWorld(b, n, 5*time.Minute, time.Minute, nil)
			ctx := context.Background()
			// One untimed round warms the caches and the pools of both.
			if _, err := w.floor(ctx); err != nil {
				b.Fatal(err)
			}
			if _, err := w.reaper.RunOnce(ctx); err != nil {
				b.Fatal(err)
			}
			var floors, passes, procs []time.Duration
			var passBytes, passObjects, rss uint64
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				start := time.Now()
				read, err := w.floor(ctx)
				floors = append(floors, time.Since(start))
				if err != nil || read != n {
					b.Fatalf("floor read %d rows (%v), want %d", read, err, n)
				}
				var res reaper.Result
				by, obj := allocsDuring(func() {
					start = time.Now()
					res, err = w.reaper.RunOnce(ctx)
					passes = append(passes, time.Since(start))
				})
				passBytes, passObjects = passBytes+by, passObjects+obj
				if err != nil || res.Scanned != n || res.Skipped["within_limit"] != n || res.Errors != 0 {
					b.Fatalf("pass = %+v, %v; want %d within_limit", res, err, n)
				}
				d, maxRSS := w.runProcess(b, bin, n, 0)
				procs = append(procs, d)
				rss = max(rss, maxRSS)
			}
			b.StopTimer()
			b.ReportMetric(median(floors), "floor-ms")
			b.ReportMetric(median(passes), "pass-ms")
			b.ReportMetric(median(passes)/median(floors), "pass/floor")
			b.ReportMetric(median(procs), "process-ms")
			b.ReportMetric(float64(rss)/1024, "peak-RSS-MiB")
			b.ReportMetric(float64(passBytes)/float64(b.N), "pass-B")
			b.ReportMetric(float64(passObjects)/float64(b.N), "pass-allocs")
		})
	}
}

// runProcess runs `jobreaper run --once` on w and returns its wall time and
// peak RSS (KiB), checking that it scanned n tasks and reaped wantReaped.
// The outage grace is off: the rows are backdated, and the benchmark's
// PostgreSQL may have started a moment ago.
func (w *scaleWorld) runProcess(b *testing.B, bin string, n, wantReaped int) (time.Duration, uint64) {
	b.Helper()
	addr := cmp.Or(os.Getenv("JOBREAPER_TEST_REDIS_ADDR"), "127.0.0.1:6379")
	cmd := exec.Command(bin, "run", "--once", "--output", "json", "--database-url", w.db.URL, "--schema", w.db.Schema,
		"--redis-url", "redis://"+addr+"/0", "--queues", strings.Join(w.queues, ","), "--log-level", "warn", "--outage-grace=false")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	err := cmd.Run()
	d := time.Since(start)
	var sum struct{ Scanned, Reaped, Errors int }
	if err != nil || json.Unmarshal(stdout.Bytes(), &sum) != nil || sum.Scanned != n || sum.Reaped != wantReaped || sum.Errors != 0 {
		b.Fatalf("run --once: %v, summary %s, want %d scanned, %d reaped\n%s", err, stdout.String(), n, wantReaped, stderr.String())
	}
	ru, _ := cmd.ProcessState.SysUsage().(*syscall.Rusage)
	if ru == nil {
		return d, 0
	}
	return d, uint64(ru.Maxrss) // KiB on Linux
}

// reset makes every active job of w stalled and PROCESSING again, as
// before a mass stall: no event, no marker, parents back at 0, and the
// dead rows of the previous round vacuumed away.
func (w *scaleWorld) reset(b *testing.B) {
	b.Helper()
	w.db.Exec(b, `UPDATE jobs SET status = 'PROCESSING', failure_reason = NULL, finished_at = NULL, marker_set_at = NULL
 WHERE status = 'FAILED' AND id = ANY($1)`, w.ids)
	w.db.Exec(b, `TRUNCATE job_events`)
	w.db.Exec(b, `UPDATE parents SET failed = 0 WHERE failed <> 0`)
	w.db.Exec(b, `VACUUM ANALYZE jobs`)
	w.db.Exec(b, `VACUUM ANALYZE parents`)
	w.deleteMarkers(b)
}

// reapFloor is the least a set-based reap of w's jobs writes: one UPDATE
// ... FROM unnest per 1,000 rows that sets them FAILED by ID, with no
// compare-and-set, event, cascade or marker. Each runs behind the planner
// settings the reap's statements run behind (no sequential scan, custom
// plans), in one pipeline: left to itself, PostgreSQL joined the 1,000 IDs
// to a sequential scan of the whole table (EXPLAIN: 85 to 260 ms per 1,000
// rows at N = 10,000, where the reap's own UPDATE of 1,000 rows took 35 to
// 45 ms), which made the floor slower per row at 10,000 than at 100,000.
func (w *scaleWorld) reapFloor(ctx context.Context) (int64, error) {
	schema := pgx.Identifier{w.db.Schema}.Sanitize()
	var n int64
	for start := 0; start < len(w.ids); start += pgstore.ReapBatchSize {
		batch := &pgx.Batch{}
		batch.Queue(`SELECT set_config('enable_seqscan', 'off', true), set_config('plan_cache_mode', 'force_custom_plan', true)`)
		batch.Queue(`UPDATE `+schema+`.jobs j SET status = 'FAILED', failure_reason = 'stalled', finished_at = now()
  FROM unnest($1::text[]) AS u(id) WHERE j.id = u.id`, w.ids[start:min(start+pgstore.ReapBatchSize, len(w.ids))])
		br := w.db.Pool.SendBatch(ctx, batch)
		_, err := br.Exec()
		if err == nil {
			var tag pgconn.CommandTag
			tag, err = br.Exec()
			n += tag.RowsAffected()
		}
		if cerr := br.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// BenchmarkScaleReap measures a pass that reaps n stalled jobs: the
// set-based compare-and-set, a reaped event each, a one-statement on_failed
// cascade per job (100 children per parent) and a marker each, against the
// floor of writing the n rows FAILED by ID. Both run on the same freshly
// reset table in each iteration. Metrics are medians: floor-s and reap-s;
// jobs/s is n / reap-s.
func BenchmarkScaleReap(b *testing.B) {
	for _, n := range []int{10000, 100000} {
		b.Run(fmt.Sprintf("N=%d", n), func(b *testing.B) {
			w := newScaleWorld(b, n, 31*time.Minute, 21*time.Minute, nil)
			parents := pgx.Identifier{w.db.Schema, "parents"}.Sanitize()
			w.store = w.db.Daemon(pgstore.WithCascades(jobs.Cascades{"bench.task": {OnFailed: []string{
				`UPDATE ` + parents + ` SET failed = failed + 1 WHERE id = @parent_id`,
			}}}))
			lister, _ := asynqstate.NewIDLister(w.rdb)
			markers := asynqstate.NewMarkerWriter(w.rdb, 0)
			// All n stall at once by design: no stall-storm limit (0, 0),
			// which the daemon's defaults would trip.
			w.reaper = reaper.New(w.store, lister, markers, reaper.Options{Queues: w.queues, Rule: baselineRule,
				MaxStalledPerPass: 0, MaxStalledFraction: 0,
				Logger: slog.New(slog.NewTextHandler(io.Discard, &slog.HandlerOptions{Level: slog.LevelInfo}))})
			ctx := context.Background()
			var floors, reaps []time.Duration
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				b.StopTimer()
				w.reset(b)
				b.StartTimer()
				start := time.Now()
				written, err := w.reapFloor(ctx)
				floors = append(floors, time.Since(start))
				if err != nil || written != int64(n) {
					b.Fatalf("floor wrote %d rows (%v), want %d", written, err, n)
				}
				b.StopTimer()
				w.reset(b)
				b.StartTimer()
				start = time.Now()
				res, err := w.reaper.RunOnce(ctx)
				reaps = append(reaps, time.Since(start))
				if err != nil || res.Reaped != n || res.Errors != 0 {
					b.Fatalf("pass = reaped %d, errors %d, %v; want %d reaped", res.Reaped, res.Errors, err, n)
				}
				b.StopTimer()
				if got := w.db.Count(b, `SELECT count(*) FROM job_events WHERE kind = 'reaped'`); got != int64(n) {
					b.Fatalf("%d reaped events, want %d", got, n)
				}
				if got := w.db.Count(b, `SELECT coalesce(sum(failed), 0) FROM parents`); got != int64(n) {
					b.Fatalf("cascades counted %d children, want %d", got, n)
				}
				b.StartTimer()
			}
			b.StopTimer()
			b.ReportMetric(median(floors)/1000, "floor-s")
			b.ReportMetric(median(reaps)/1000, "reap-s")
			b.ReportMetric(float64(n)/(median(reaps)/1000), "jobs/s")
		})
	}
}
