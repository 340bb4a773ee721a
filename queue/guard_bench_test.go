package queue

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
)

// roundTrips counts the PostgreSQL round trips (statements and pipelines)
// and Redis round trips (commands and pipelines) made before a handler
// runs (the context holds no lease yet: the guard's admission) and after.
type roundTrips struct {
	pgAdmit, pgAfter, redisAdmit, redisAfter atomic.Int64
}

func admitting(ctx context.Context) bool {
	_, err := jobs.LeaseFromContext(ctx)
	return err != nil
}

func (r *roundTrips) countPG(ctx context.Context) {
	if admitting(ctx) {
		r.pgAdmit.Add(1)
	} else {
		r.pgAfter.Add(1)
	}
}

func (r *roundTrips) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	r.countPG(ctx)
	return ctx
}
func (r *roundTrips) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (r *roundTrips) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	r.countPG(ctx)
	return ctx
}
func (r *roundTrips) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (r *roundTrips) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}

func (r *roundTrips) countRedis(ctx context.Context) {
	if admitting(ctx) {
		r.redisAdmit.Add(1)
	} else {
		r.redisAfter.Add(1)
	}
}

func (r *roundTrips) DialHook(next redis.DialHook) redis.DialHook { return next }
func (r *roundTrips) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		r.countRedis(ctx)
		return next(ctx, cmd)
	}
}
func (r *roundTrips) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		r.countRedis(ctx)
		return next(ctx, cmds)
	}
}

// BenchmarkScaleGuard runs n tasks of an auto-complete type through a real
// asynq server with the start guard in front of a handler that does
// nothing, and the same number through a server without the guard. It
// reports the guard's round trips per task start (before the handler runs)
// and both throughputs, medians over the iterations.
func BenchmarkScaleGuard(b *testing.B) {
	const n = 2000
	b.Run(fmt.Sprintf("N=%d", n), func(b *testing.B) {
		ctx := context.Background()
		db := jobstest.New(b)
		db.JobType(b, "report.export", "30 minutes", "", "")
		db.Exec(b, `UPDATE job_types SET auto_complete = true WHERE name = 'report.export'`)
		rt := &roundTrips{}
		cfg, err := pgxpool.ParseConfig(db.URL)
		if err != nil {
			b.Fatal(err)
		}
		cfg.ConnConfig.Tracer = rt
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(pool.Close)
		rc := realRedis(b)
		counted := redis.NewClient(&redis.Options{Addr: rc.Options().Addr, ContextTimeoutEnabled: true})
		b.Cleanup(func() { _ = counted.Close() })
		counted.AddHook(rt)
		markers, err := NewMarkerStore(counted)
		if err != nil {
			b.Fatal(err)
		}
		guard := NewGuard(jobs.NewStore(pool, jobs.WithSchema(db.Schema)), markers, WithWorker("bench"),
			WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))), WithRegisterer(prometheus.NewRegistry()))
		client := asynq.NewClientFromRedisClient(rc)
		var guarded, bare []float64
		var starts int64
		for i := range b.N {
			q := unique(b, "guard-bench-")
			deleteQueueAtCleanup(b, rc, q)
			ids := make([]string, n)
			for k := range ids {
				ids[k] = fmt.Sprintf("%s-%05d", q, k)
			}
			db.Exec(b, `INSERT INTO jobs (id, type, status, queue) SELECT unnest($1::text[]), 'report.export', 'QUEUED', $2`, ids, q)
			for _, id := range ids {
				if _, err := client.EnqueueContext(ctx, asynq.NewTask("report.export", nil), asynq.TaskID(id), asynq.Queue(q)); err != nil {
					b.Fatal(err)
				}
			}
			var done atomic.Int64
			mux := asynq.NewServeMux()
			mux.Use(guard.Middleware())
			mux.HandleFunc("report.export", func(context.Context, *asynq.Task) error { done.Add(1); return nil })
			before := rt.pgAdmit.Load()
			guarded = append(guarded, serveUntil(b, rc, q, mux, &done, n))
			starts += n
			b.Logf("iteration %d: %d admission statements for %d starts", i, rt.pgAdmit.Load()-before, n)
			jobstest.Eventually(b, "every guarded job COMPLETED", func() bool {
				return db.Count(b, `SELECT count(*) FROM jobs WHERE queue = $1 AND status = 'COMPLETED'`, q) == n
			})

			qb := unique(b, "bare-bench-")
			deleteQueueAtCleanup(b, rc, qb)
			for k := range n {
				if _, err := client.EnqueueContext(ctx, asynq.NewTask("report.export", nil), asynq.TaskID(fmt.Sprintf("%s-%05d", qb, k)), asynq.Queue(qb)); err != nil {
					b.Fatal(err)
				}
			}
			var bareDone atomic.Int64
			bareMux := asynq.NewServeMux()
			bareMux.HandleFunc("report.export", func(context.Context, *asynq.Task) error { bareDone.Add(1); return nil })
			bare = append(bare, serveUntil(b, rc, qb, bareMux, &bareDone, n))
		}
		b.ReportMetric(float64(rt.redisAdmit.Load())/float64(starts), "redis-rt/start")
		b.ReportMetric(float64(rt.pgAdmit.Load())/float64(starts), "pg-rt/start")
		b.ReportMetric(medianOf(guarded), "guarded-tasks/s")
		b.ReportMetric(medianOf(bare), "bare-tasks/s")
	})
}

// serveUntil serves q with handler until done reaches n and returns the
// throughput in tasks per second.
func serveUntil(b *testing.B, rc *redis.Client, q string, handler asynq.Handler, done *atomic.Int64, n int64) float64 {
	b.Helper()
	srv := asynq.NewServerFromRedisClient(rc, asynq.Config{Queues: map[string]int{q: 1}, Concurrency: 20,
		Logger: asynqLogger{}, LogLevel: asynq.FatalLevel, IsFailure: IsFailure})
	start := time.Now()
	if err := srv.Start(handler); err != nil {
		b.Fatal(err)
	}
	defer srv.Shutdown()
	deadline := start.Add(5 * time.Minute)
	for done.Load() < n {
		if time.Now().After(deadline) {
			b.Fatalf("%d of %d tasks ran within 5 minutes", done.Load(), n)
		}
		time.Sleep(time.Millisecond)
	}
	return float64(n) / time.Since(start).Seconds()
}

func medianOf(xs []float64) float64 {
	s := slices.Sorted(slices.Values(xs))
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
