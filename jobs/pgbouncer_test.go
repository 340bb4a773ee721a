package jobs_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
)

func TestCase_B40_BehindPgBouncerTransactionMode(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const flows, poolSize, clients = 200, 5, 40
	s := jobstest.NewPooled(t, jobstest.PgBouncerOptions{PoolSize: poolSize})

	config := map[string]string{}
	for _, row := range s.PgBouncer.Show(t, "CONFIG") {
		config[row["key"]] = row["value"]
	}
	if config["pool_mode"] != "transaction" || config["ignore_startup_parameters"] != "search_path" {
		t.Fatalf("pooler runs pool_mode %q, ignore_startup_parameters %q; want transaction, search_path",
			config["pool_mode"], config["ignore_startup_parameters"])
	}
	if got, ok := config["max_prepared_statements"]; s.PgBouncer.PreparedStatementsPinned && got != "0" || !s.PgBouncer.PreparedStatementsPinned && ok {
		t.Fatalf("PgBouncer %s: max_prepared_statements = %q (present %v), want 0 where the setting exists", s.PgBouncer.Version, got, ok)
	}

	_, err := s.Direct.Exec(ctx, `
CREATE SCHEMA app;
CREATE TABLE app.reports (job_id text PRIMARY KEY, generation bigint NOT NULL);
INSERT INTO jobreaper.job_types (name, max_runtime) VALUES ('report.export', '1 hour');
INSERT INTO jobreaper.jobs (id, type, status) SELECT 'job-' || i, 'report.export', 'QUEUED' FROM generate_series(1, 200) i`)
	requireNoErr(t, err)

	pool := s.Connect(t, clients)
	var current string
	requireNoErr(t, pool.QueryRow(ctx, `SELECT current_schema()`).Scan(&current))
	if current != "public" {
		t.Fatalf("current_schema() through the pooler = %q, want public (the pooler ignores search_path)", current)
	}
	store := jobs.NewStore(pool, jobs.WithSchema(jobstest.PooledSchema))
	if err := store.CheckSchema(ctx); err != nil {
		t.Fatalf("start-up check through the pooler: %v", err)
	}
	hb, err := jobs.NewHeartbeater(store, nil, jobs.HeartbeatIntervalDefault)
	requireNoErr(t, err)

	// 200 claim/heartbeat/complete flows at once, on more client
	// connections than the pooler has server connections.
	errs := make([]error, flows)
	var wg sync.WaitGroup
	for i := range flows {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = pooledFlow(ctx, store, hb, pool, fmt.Sprintf("job-%d", i+1), fmt.Sprintf("w%d", i))
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("flow %d: %v", i+1, err)
		}
	}

	if n := s.Count(t, `SELECT count(*) FROM jobreaper.jobs
 WHERE status = 'COMPLETED' AND generation = 1 AND progress_mark = 1 AND finished_at IS NOT NULL`); n != flows {
		t.Errorf("COMPLETED rows at generation 1 with progress mark 1 = %d, want %d", n, flows)
	}
	for _, kind := range []string{"claimed", jobs.EventCompleted} {
		if n := s.Count(t, `SELECT count(*) FROM jobreaper.job_events WHERE kind = $1`, kind); n != flows {
			t.Errorf("%s events = %d, want %d", kind, n, flows)
		}
	}
	if n := s.Count(t, `SELECT count(*) FROM jobreaper.job_events WHERE kind <> 'claimed' AND kind <> $1`, jobs.EventCompleted); n != 0 {
		t.Errorf("%d other events (late_result_rejected, ...), want 0", n)
	}
	if n := s.Count(t, `SELECT count(*) FROM app.reports`); n != flows {
		t.Errorf("product rows = %d, want %d", n, flows)
	}
	s.RequirePublicUntouched(t)

	// The work really was multiplexed: more client connections than
	// server connections.
	servers := 0
	for _, row := range s.PgBouncer.Show(t, "SERVERS") {
		if row["database"] == s.Name {
			servers++
		}
	}
	if clientConns := pool.Stat().TotalConns(); servers > poolSize || clientConns <= poolSize {
		t.Errorf("server connections %d (want at most %d) for %d client connections (want more than %d)", servers, poolSize, clientConns, poolSize)
	}
}

// pooledFlow is one attempt's whole life through the pooler: claim, one
// heartbeat that advances the mark, and a completion that writes a product
// row in the same transaction.
func pooledFlow(ctx context.Context, store *jobs.Store, hb *jobs.Heartbeater, pool *pgxpool.Pool, id, worker string) error {
	lease, err := store.Claim(ctx, id, 0, worker)
	if err != nil {
		return fmt.Errorf("claim: %w", err)
	}
	res, err := hb.Heartbeat(ctx, lease, 1)
	if err != nil || !res.Written {
		return fmt.Errorf("heartbeat: written %v, err %v", res.Written, err)
	}
	_, err = store.CompleteWith(ctx, pool, lease, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO app.reports (job_id, generation) VALUES ($1, $2)`, lease.JobID, lease.Generation)
		return err
	})
	if err != nil {
		return fmt.Errorf("complete: %w", err)
	}
	return nil
}

// Behind the pooler every connection reports public, so only a lookup by
// qualified name can tell that a schema lacks jobreaper's tables.
func TestPooledStartUpCheckRefusesAWrongSchemaName(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := jobstest.NewPooled(t, jobstest.PgBouncerOptions{})
	pool := s.Connect(t, 4)

	const wrong = "jobreapr"
	err := jobs.NewStore(pool, jobs.WithSchema(wrong)).CheckSchema(ctx)
	if !errors.Is(err, jobs.ErrNotMigrated) {
		t.Fatalf("CheckSchema(%s) = %v, want ErrNotMigrated", wrong, err)
	}
	for _, want := range []string{`schema "jobreapr" has no jobreaper tables`, "jobreaper migrate --schema jobreapr"} {
		if !strings.Contains(err.Error(), want) {
			t.Fatalf("CheckSchema error %q does not say %q", err, want)
		}
	}
	if err := checkMigrated(ctx, pool, wrong); !errors.Is(err, jobs.ErrNotMigrated) {
		t.Fatalf("CheckMigrated(%s) = %v, want ErrNotMigrated (the daemon's check)", wrong, err)
	}
	if err := checkMigrated(ctx, pool, jobstest.PooledSchema); err != nil {
		t.Fatalf("CheckMigrated(%s) = %v, want nil", jobstest.PooledSchema, err)
	}
}

// Connect sends no startup parameter a pooler would refuse: a PgBouncer
// that ignores none (so refuses search_path, options, extra_float_digits)
// accepts its connections, and the claim runs through it.
func TestConnectSendsNoStartupParameterAPoolerRefuses(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := jobstest.NewPooled(t, jobstest.PgBouncerOptions{IgnoreStartupParameters: []string{}})
	_, err := s.Direct.Exec(ctx, `INSERT INTO jobreaper.job_types (name, max_runtime) VALUES ('report.export', '1 hour');
INSERT INTO jobreaper.jobs (id, type, status) VALUES ('job-1', 'report.export', 'QUEUED')`)
	requireNoErr(t, err)

	// The premise: this pooler refuses a search_path startup parameter.
	if _, err := pgx.Connect(ctx, s.PgBouncer.URL(s.Name, "search_path="+jobstest.PooledSchema)); err == nil ||
		!strings.Contains(err.Error(), "unsupported startup parameter") {
		t.Fatalf("connecting with search_path: %v, want the pooler's refusal", err)
	}
	pool, err := jobs.Connect(ctx, s.PgBouncer.URL(s.Name, "default_query_exec_mode=exec"), jobstest.PooledSchema)
	if err != nil {
		t.Fatalf("Connect through a pooler that ignores no startup parameter: %v", err)
	}
	t.Cleanup(pool.Close)
	lease, err := jobs.NewStore(pool, jobs.WithSchema(jobstest.PooledSchema)).Claim(ctx, "job-1", 0, "w1")
	if err != nil || lease.Generation != 1 {
		t.Fatalf("claim through the pooler: %+v, %v; want generation 1", lease, err)
	}
	s.RequirePublicUntouched(t)
}

// The rest of the worker library through the pooler, in the mode pooled
// URLs use (default_query_exec_mode=exec, where pgx infers each argument's
// type from its Go value): resumable progress and its replay, Fail with its
// cascade, a late result's event, Release and auto-completion. Cascades
// keep their unqualified names, which resolve through the server's default
// search_path (public here), as docs/schema.md says.
func TestPooledWorkerCallsOnANonPublicSchema(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := jobstest.NewPooled(t, jobstest.PgBouncerOptions{})
	_, err := s.Direct.Exec(ctx, `
CREATE TABLE public.courses (id text PRIMARY KEY, completed int NOT NULL DEFAULT 0, failed int NOT NULL DEFAULT 0);
CREATE TABLE public.lessons (job_id text NOT NULL, lesson bigint NOT NULL);
INSERT INTO public.courses (id) VALUES ('c1');
INSERT INTO jobreaper.job_types (name, max_runtime) VALUES ('course.publish', '1 hour');
INSERT INTO jobreaper.job_types (name, max_runtime, auto_complete) VALUES ('course.touch', '1 hour', true);
INSERT INTO jobreaper.jobs (id, type, status, parent_id) VALUES
  ('a', 'course.publish', 'QUEUED', 'c1'), ('b', 'course.publish', 'QUEUED', 'c1'),
  ('c', 'course.publish', 'QUEUED', 'c1'), ('d', 'course.touch', 'QUEUED', 'c1')`)
	requireNoErr(t, err)
	pool := s.Connect(t, 4)
	store := jobs.NewStore(pool, jobs.WithSchema(jobstest.PooledSchema), jobs.WithCascades(jobs.Cascades{"course.publish": {
		OnCompleted: []string{`UPDATE courses SET completed = completed + 1 WHERE id = @parent_id`},
		OnFailed:    []string{`UPDATE courses SET failed = failed + 1 WHERE id = @parent_id`},
	}}))
	requireNoErr(t, store.CheckSchema(ctx))
	requireNoErr(t, store.PrepareCascades(ctx))
	claimed := func(id string) jobs.Lease {
		t.Helper()
		lease, err := store.Claim(ctx, id, 0, "w1")
		requireNoErr(t, err)
		return lease
	}

	a := claimed("a")
	requireNoErr(t, store.SetTotal(ctx, a, 2))
	advance := func() jobs.AdvanceResult {
		t.Helper()
		var res jobs.AdvanceResult
		requireNoErr(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			var err error
			if res, err = store.Advance(ctx, tx, a, "lesson-1", 0, 1); err != nil || res.Replayed {
				return err
			}
			_, err = tx.Exec(ctx, `INSERT INTO public.lessons (job_id, lesson) VALUES ($1, $2)`, a.JobID, res.Cursor)
			return err
		}))
		return res
	}
	if first, again := advance(), advance(); first.Cursor != 1 || first.Replayed || again.Cursor != 1 || !again.Replayed {
		t.Fatalf("Advance then its replay = %+v, %+v; want cursor 1 new, then cursor 1 replayed", first, again)
	}
	_, err = store.CompleteWith(ctx, pool, a, func(pgx.Tx) error { return nil })
	requireNoErr(t, err)

	b := claimed("b")
	requireNoErr(t, store.Fail(ctx, b, "source_missing"))
	if err := store.Fail(ctx, b, "source_missing"); !errors.Is(err, jobs.ErrJobTerminal) || strings.Contains(err.Error(), "event failed") {
		t.Fatalf("second Fail = %v, want ErrJobTerminal with its event recorded", err)
	}

	requireNoErr(t, store.Release(ctx, claimed("c")))
	if res, err := store.AutoComplete(ctx, claimed("d")); err != nil || res.Replayed {
		t.Fatalf("AutoComplete = %+v, %v", res, err)
	}

	for id, want := range map[string]string{"a": "COMPLETED", "b": "FAILED", "c": "QUEUED", "d": "COMPLETED"} {
		if n := s.Count(t, `SELECT count(*) FROM jobreaper.jobs WHERE id = $1 AND status = $2`, id, want); n != 1 {
			t.Errorf("job %s is not %s", id, want)
		}
	}
	for kind, want := range map[string]int64{"claimed": 4, jobs.EventCompleted: 2, jobs.EventFailed: 1,
		jobs.EventReleased: 1, jobs.EventLateResultRejected: 1} {
		if n := s.Count(t, `SELECT count(*) FROM jobreaper.job_events WHERE kind = $1`, kind); n != want {
			t.Errorf("%s events = %d, want %d", kind, n, want)
		}
	}
	if n := s.Count(t, `SELECT count(*) FROM jobreaper.job_batches WHERE job_id = 'a' AND cursor_after = 1`); n != 1 {
		t.Errorf("recorded batches of a = %d, want 1", n)
	}
	if n := s.Count(t, `SELECT count(*) FROM public.lessons`); n != 1 {
		t.Errorf("lesson rows = %d, want 1 (the replay must not write again)", n)
	}
	if n := s.Count(t, `SELECT completed * 10 + failed FROM public.courses WHERE id = 'c1'`); n != 11 {
		t.Errorf("course c1: completed*10+failed = %d, want 11 (one completion cascade, one failure cascade)", n)
	}
	s.RequirePublicUntouched(t)
}
