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
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
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
	// srv is the live asynq server of the queues.
	srv *asynq.Server
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
	w.srv = w.serve(b)
	w.store = w.db.Daemon(pgstore.WithCascades(cascades))
	w.reaper = w.newReaper(b)
	return w
}

// newReaper returns a reaper of w's queues as the daemon builds one: the
// ID lister, the marker writer and asynq's status reader (the live
// servers and task states), with the stall-storm limits off (0, 0): the
// reap benchmark stalls every job at once by design.
func (w *scaleWorld) newReaper(b *testing.B) *reaper.Reaper {
	b.Helper()
	lister, err := asynqstate.NewIDLister(w.rdb)
	if err != nil {
		b.Fatal(err)
	}
	markers := asynqstate.NewMarkerWriter(w.rdb, 0)
	return reaper.New(w.store, lister, markers, reaper.Options{
		Queues: w.queues, Rule: baselineRule, Asynq: asynqstate.NewStatusReader(w.rdb, 0),
		MaxStalledPerPass: 0, MaxStalledFraction: 0,
		Logger: slog.New(slog.NewTextHandler(io.Discard, &slog.HandlerOptions{Level: slog.LevelInfo})),
	})
}

// serve runs a live asynq server on w's queues, as production has one:
// without it a pass holds its marker re-assertion and the lost-task
// search (no live server serves the queues, as in a wrong Redis
// database) and counts the missing status reader as an error. Its tasks'
// leases run 24 hours (queuetest.MakeActive), so its recoverer leaves them
// alone, and it has nothing pending to run.
func (w *scaleWorld) serve(b *testing.B) *asynq.Server {
	b.Helper()
	weights := map[string]int{}
	for _, q := range w.queues {
		weights[q] = 1
	}
	srv := asynq.NewServerFromRedisClient(w.rdb, asynq.Config{Queues: weights, Concurrency: 1,
		LogLevel: asynq.FatalLevel, ShutdownTimeout: time.Second})
	if err := srv.Start(asynq.HandlerFunc(func(ctx context.Context, _ *asynq.Task) error {
		<-ctx.Done()
		return ctx.Err()
	})); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(srv.Shutdown)
	insp := asynq.NewInspectorFromRedisClient(w.rdb)
	deadline := time.Now().Add(30 * time.Second)
	for {
		servers, err := insp.Servers()
		if err == nil && slices.ContainsFunc(servers, func(s *asynq.ServerInfo) bool { return s.Queues[w.queues[0]] > 0 }) {
			return srv
		}
		if time.Now().After(deadline) {
			b.Fatalf("the asynq server of the benchmark's queues is not listed as live after 30 s (%v)", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
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

// listRaw lists the IDs of w's active tasks raw, per queue: one LLEN,
// then the LRANGE chunks of 1,000 in one pipeline. It is the listing part
// of both floors.
func (w *scaleWorld) listRaw(ctx context.Context) ([]string, error) {
	var ids []string
	for _, q := range w.queues {
		key := "asynq:{" + q + "}:active"
		n, err := w.rdb.LLen(ctx, key).Result()
		if err != nil {
			return nil, err
		}
		cmds, err := w.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			for start := int64(0); start < n; start += 1000 {
				p.LRange(ctx, key, start, start+999)
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
		for _, c := range cmds {
			ids = append(ids, c.(*redis.StringSliceCmd).Val()...)
		}
	}
	return ids, nil
}

// valuesFloor is the first floor the pass was measured against: the IDs
// listed raw (listRaw) and their rows and limits loaded with a custom plan
// (an unnamed statement, batches of 10,000), all 15 columns read with
// rows.Values() (each boxed into an interface) and nothing kept. It
// returns how many rows it read.
func (w *scaleWorld) valuesFloor(ctx context.Context) (int, error) {
	ids, err := w.listRaw(ctx)
	if err != nil {
		return 0, err
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

// floorRow is what the typed floor keeps of a row: the columns Decide
// reads and the reap repeats, typed as the product scans them.
type floorRow struct {
	id, typ, status, queue string
	generation             int64
	started, updated       pgtype.Timestamptz
	limits                 *floorLimits
}

// floorLimits is a job_types row as the typed floor keeps it, one per type.
type floorLimits struct {
	maxRuntime, stall, hard pgtype.Interval
}

// typedFloor is the least a pass over the active tasks can do: the IDs
// listed raw (listRaw), the job_types rows read once, and the active rows
// loaded by ID with a custom plan (behind the product's planner settings,
// in the same pipeline: no sequential scan, force_custom_plan; batches of
// 10,000), exactly the
// columns the decision reads scanned into typed fields and kept for the
// whole pass (the product keeps one batch). It returns the rows it kept.
func (w *scaleWorld) typedFloor(ctx context.Context) ([]floorRow, error) {
	ids, err := w.listRaw(ctx)
	if err != nil {
		return nil, err
	}
	schema := pgx.Identifier{w.db.Schema}.Sanitize()
	limits := map[string]*floorLimits{}
	trows, err := w.db.Pool.Query(ctx, `SELECT name, max_runtime, stall_timeout, hard_timeout FROM `+schema+`.job_types`,
		pgx.QueryExecModeExec)
	if err != nil {
		return nil, err
	}
	for trows.Next() {
		var name string
		l := &floorLimits{}
		if err := trows.Scan(&name, &l.maxRuntime, &l.stall, &l.hard); err != nil {
			trows.Close()
			return nil, err
		}
		limits[name] = l
	}
	if err := trows.Err(); err != nil {
		return nil, err
	}
	sql := `SELECT id, type, status, generation, coalesce(queue, ''), started_at, updated_at
  FROM ` + schema + `.jobs WHERE id = ANY($1)`
	kept := make([]floorRow, 0, len(ids))
	for start := 0; start < len(ids); start += pgstore.LoadBatchSize {
		batch := &pgx.Batch{}
		batch.Queue(`SELECT set_config('enable_seqscan', 'off', true), set_config('plan_cache_mode', 'force_custom_plan', true)`)
		batch.Queue(sql, ids[start:min(start+pgstore.LoadBatchSize, len(ids))])
		br := w.db.Pool.SendBatch(ctx, batch)
		if _, err := br.Exec(); err != nil {
			_ = br.Close()
			return nil, err
		}
		rows, err := br.Query()
		if err != nil {
			_ = br.Close()
			return nil, err
		}
		for rows.Next() {
			var r floorRow
			if err := rows.Scan(&r.id, &r.typ, &r.status, &r.generation, &r.queue, &r.started, &r.updated); err != nil {
				rows.Close()
				_ = br.Close()
				return nil, err
			}
			r.limits = limits[r.typ]
			kept = append(kept, r)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			_ = br.Close()
			return nil, err
		}
		if err := br.Close(); err != nil {
			return nil, err
		}
	}
	return kept, nil
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
// tasks against the floors of the same n, interleaved, and the whole
// `jobreaper run --once` process (start-up included) with its peak RSS.
// Metrics: floor-ms (typedFloor), values-floor-ms (valuesFloor), pass-ms
// and pass/floor (against the typed floor) are medians; after-load-ns is
// (pass - typed floor) / n, an upper bound of the pass's work per task
// beyond the listing and the load; process-ms and peak-RSS-MiB come from
// the real binary; pass-B and pass-allocs are the pass's own allocations
// (the harness's B/op covers the floors + pass + the process's pipes).
// A pass that counts an error fails the benchmark.
func BenchmarkScalePass(b *testing.B) {
	bin := fleettest.BuildJobreaperRelease(b)
	for _, n := range []int{1000, 20000, 100000} {
		b.Run(fmt.Sprintf("N=%d", n), func(b *testing.B) {
			w := newScaleWorld(b, n, 5*time.Minute, time.Minute, nil)
			ctx := context.Background()
			// One untimed round warms the caches and the pools of all.
			if _, err := w.typedFloor(ctx); err != nil {
				b.Fatal(err)
			}
			if _, err := w.valuesFloor(ctx); err != nil {
				b.Fatal(err)
			}
			if res, err := w.reaper.RunOnce(ctx); err != nil || res.Errors != 0 {
				b.Fatalf("warm-up pass = %+v, %v; want no error", res, err)
			}
			var floors, vfloors, passes, procs []time.Duration
			var passBytes, passObjects, rss uint64
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				start := time.Now()
				kept, err := w.typedFloor(ctx)
				floors = append(floors, time.Since(start))
				if err != nil || len(kept) != n {
					b.Fatalf("typed floor kept %d rows (%v), want %d", len(kept), err, n)
				}
				kept = nil
				start = time.Now()
				read, err := w.valuesFloor(ctx)
				vfloors = append(vfloors, time.Since(start))
				if err != nil || read != n {
					b.Fatalf("values floor read %d rows (%v), want %d", read, err, n)
				}
				var res reaper.Result
				by, obj := allocsDuring(func() {
					start = time.Now()
					res, err = w.reaper.RunOnce(ctx)
					passes = append(passes, time.Since(start))
				})
				passBytes, passObjects = passBytes+by, passObjects+obj
				if err != nil || res.Scanned != n || res.Skipped["within_limit"] != n || res.Errors != 0 {
					b.Fatalf("pass = %+v, %v; want %d within_limit and no error", res, err, n)
				}
				d, maxRSS := w.runProcess(b, bin, n, 0)
				procs = append(procs, d)
				rss = max(rss, maxRSS)
			}
			b.StopTimer()
			b.ReportMetric(median(floors), "floor-ms")
			b.ReportMetric(median(vfloors), "values-floor-ms")
			b.ReportMetric(median(passes), "pass-ms")
			b.ReportMetric(median(passes)/median(floors), "pass/floor")
			b.ReportMetric((median(passes)-median(floors))*1e6/float64(n), "after-load-ns")
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
//
// The peak RSS is GNU time's (/usr/bin/time -f %M), which forks the
// process from its own small one. The rusage Go's exec returns is not the
// process's own: Go starts a child sharing the parent's memory until
// exec (vfork), and Linux carries that memory's high-water mark into the
// child's ru_maxrss, so it reported this benchmark's own peak (80 to 90
// MiB at 100,000 tasks, with the floors' rows) whenever that was larger.
// Without GNU time the peak is reported as 0.
func (w *scaleWorld) runProcess(b *testing.B, bin string, n, wantReaped int) (time.Duration, uint64) {
	b.Helper()
	addr := cmp.Or(os.Getenv("JOBREAPER_TEST_REDIS_ADDR"), "127.0.0.1:6379")
	args := []string{bin, "run", "--once", "--output", "json", "--database-url", w.db.URL, "--schema", w.db.Schema,
		"--redis-url", "redis://" + addr + "/0", "--queues", strings.Join(w.queues, ","), "--log-level", "warn", "--outage-grace=false"}
	rssFile := ""
	if _, err := os.Stat(gnuTime); err == nil {
		rssFile = filepath.Join(b.TempDir(), "maxrss")
		args = append([]string{gnuTime, "-f", "%M", "-o", rssFile}, args...)
	}
	cmd := exec.Command(args[0], args[1:]...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	err := cmd.Run()
	d := time.Since(start)
	var sum struct{ Scanned, Reaped, Errors int }
	if err != nil || json.Unmarshal(stdout.Bytes(), &sum) != nil || sum.Scanned != n || sum.Reaped != wantReaped || sum.Errors != 0 {
		b.Fatalf("run --once: %v, summary %s, want %d scanned, %d reaped\n%s", err, stdout.String(), n, wantReaped, stderr.String())
	}
	if rssFile == "" {
		return d, 0
	}
	out, err := os.ReadFile(rssFile)
	if err != nil {
		b.Fatal(err)
	}
	kib, err := strconv.ParseUint(strings.TrimSpace(string(out)), 10, 64)
	if err != nil {
		b.Fatalf("GNU time's peak RSS %q: %v", out, err)
	}
	return d, kib
}

// gnuTime is GNU time, which runProcess measures the peak RSS with.
const gnuTime = "/usr/bin/time"

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

// writeFloor is the least a set-based reap of w's jobs writes: one UPDATE
// ... FROM unnest per 1,000 rows that sets them FAILED by ID, with no
// compare-and-set, event, cascade or marker. Each runs behind the planner
// settings the reap's statements run behind (no sequential scan, custom
// plans), in one pipeline: left to itself, PostgreSQL joined the 1,000 IDs
// to a sequential scan of the whole table (EXPLAIN: 85 to 260 ms per 1,000
// rows at N = 10,000, where the reap's own UPDATE of 1,000 rows took 35 to
// 45 ms), which made the floor slower per row at 10,000 than at 100,000.
func (w *scaleWorld) writeFloor(ctx context.Context) (int64, error) {
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

// reapFloor is the least a reap of w's jobs cannot avoid writing, done
// the cheapest way: per batch of 1,000, in one pipeline and one
// transaction, the planner settings the reap runs behind, one UPDATE of
// the rows by ID (the columns the reap sets), one INSERT of their reaped
// events from the same ID set, and the benchmark's cascade statement for
// each row (it names one parent: a product's cascade runs once per reaped
// row); then one Redis pipeline of the batch's markers (a plain SET with
// their expiry). No lock query, no compare-and-set re-check, no per-row
// round trip. The parents are the ones newScaleWorld gave the rows.
func (w *scaleWorld) reapFloor(ctx context.Context) (int64, error) {
	schema := pgx.Identifier{w.db.Schema}.Sanitize()
	var n int64
	for start := 0; start < len(w.ids); start += pgstore.ReapBatchSize {
		end := min(start+pgstore.ReapBatchSize, len(w.ids))
		ids := w.ids[start:end]
		batch := &pgx.Batch{}
		batch.Queue(`BEGIN`)
		batch.Queue(`SELECT set_config('enable_seqscan', 'off', true), set_config('plan_cache_mode', 'force_custom_plan', true)`)
		batch.Queue(`UPDATE `+schema+`.jobs SET status = 'FAILED', failure_reason = 'stalled', finished_at = now(), marker_set_at = now()
 WHERE id = ANY($1)`, ids)
		batch.Queue(`INSERT INTO `+schema+`.job_events (job_id, kind, generation, worker, detail)
SELECT u.id, 'reaped', 1, 'w1', '{"reason":"stalled"}' FROM unnest($1::text[]) AS u(id)`, ids)
		for i := start; i < end; i++ {
			batch.Queue(`UPDATE `+schema+`.parents SET failed = failed + 1 WHERE id = $1`, fmt.Sprintf("P%d", i/100))
		}
		batch.Queue(`COMMIT`)
		br := w.db.Pool.SendBatch(ctx, batch)
		var err error
		for i := range batch.Len() {
			tag, e := br.Exec()
			if e != nil {
				err = e
				break
			}
			if i == 2 {
				n += tag.RowsAffected()
			}
		}
		if cerr := br.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return n, err
		}
		if _, err := w.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			for _, id := range ids {
				p.Set(ctx, queue.MarkerKey(id), "1", 7*24*time.Hour)
			}
			return nil
		}); err != nil {
			return n, err
		}
	}
	return n, nil
}

// BenchmarkScaleReap measures a pass that reaps n stalled jobs: the
// set-based compare-and-set, a reaped event each, a one-statement on_failed
// cascade per job (100 children per parent) and a marker each, against the
// reap floor (reapFloor: the same writes without the re-check, the cheapest
// way) and the write-only floor (writeFloor: the rows set FAILED by ID).
// All three run on the same freshly reset table in each iteration.
// Metrics are medians: reap-floor-s, floor-s (write-only) and reap-s;
// jobs/s is n / reap-s.
func BenchmarkScaleReap(b *testing.B) {
	for _, n := range []int{10000, 100000} {
		b.Run(fmt.Sprintf("N=%d", n), func(b *testing.B) {
			w := newScaleWorld(b, n, 31*time.Minute, 21*time.Minute, nil)
			parents := pgx.Identifier{w.db.Schema, "parents"}.Sanitize()
			w.store = w.db.Daemon(pgstore.WithCascades(jobs.Cascades{"bench.task": {OnFailed: []string{
				`UPDATE ` + parents + ` SET failed = failed + 1 WHERE id = @parent_id`,
			}}}))
			w.reaper = w.newReaper(b)
			ctx := context.Background()
			checkWritten := func(what string) {
				if got := w.db.Count(b, `SELECT count(*) FROM job_events WHERE kind = 'reaped'`); got != int64(n) {
					b.Fatalf("%s: %d reaped events, want %d", what, got, n)
				}
				if got := w.db.Count(b, `SELECT coalesce(sum(failed), 0) FROM parents`); got != int64(n) {
					b.Fatalf("%s: cascades counted %d children, want %d", what, got, n)
				}
			}
			var floors, rfloors, reaps []time.Duration
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				b.StopTimer()
				w.reset(b)
				b.StartTimer()
				start := time.Now()
				written, err := w.writeFloor(ctx)
				floors = append(floors, time.Since(start))
				if err != nil || written != int64(n) {
					b.Fatalf("write floor wrote %d rows (%v), want %d", written, err, n)
				}
				b.StopTimer()
				w.reset(b)
				b.StartTimer()
				start = time.Now()
				written, err = w.reapFloor(ctx)
				rfloors = append(rfloors, time.Since(start))
				if err != nil || written != int64(n) {
					b.Fatalf("reap floor wrote %d rows (%v), want %d", written, err, n)
				}
				b.StopTimer()
				checkWritten("reap floor")
				w.reset(b)
				b.StartTimer()
				start = time.Now()
				res, err := w.reaper.RunOnce(ctx)
				reaps = append(reaps, time.Since(start))
				if err != nil || res.Reaped != n || res.Errors != 0 {
					b.Fatalf("pass = reaped %d, errors %d, %v; want %d reaped and no error", res.Reaped, res.Errors, err, n)
				}
				b.StopTimer()
				checkWritten("pass")
				b.StartTimer()
			}
			b.StopTimer()
			b.ReportMetric(median(floors)/1000, "floor-s")
			b.ReportMetric(median(rfloors)/1000, "reap-floor-s")
			b.ReportMetric(median(reaps)/1000, "reap-s")
			b.ReportMetric(median(reaps)/median(rfloors), "reap/floor")
			b.ReportMetric(float64(n)/(median(reaps)/1000), "jobs/s")
		})
	}
}
