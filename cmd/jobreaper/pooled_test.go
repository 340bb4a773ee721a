package main

import (
	"context"
	"regexp"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
	"github.com/jobreaper/jobreaper/queue"
)

// The daemon's side of B40: migrate, the start-up check and a whole pass
// (load, reap, event, marker, marker confirmation) run through PgBouncer in
// transaction mode on a non-public schema, touching nothing in public.
func TestPooledMigrateAndRunOnceOnANonPublicSchema(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	const schema = "jobreaper"
	name, directURL := jobstest.NewDatabase(t)
	direct, err := pgxpool.New(ctx, directURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(direct.Close)
	pgb := jobstest.StartPgBouncer(t, jobstest.PgBouncerOptions{})
	pooled := pgb.URL(name, "default_query_exec_mode=exec")
	count := func(sql string, args ...any) int64 {
		t.Helper()
		var n int64
		if err := direct.QueryRow(ctx, sql, args...).Scan(&n); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
		return n
	}

	// Two migrations at once through the pooler: the lock holds across
	// pooled connections, so exactly one applies the versions.
	var wg sync.WaitGroup
	results := make([]result, 2)
	for i := range results {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i] = run(t, "migrate", "--database-url", pooled, "--schema", schema)
		}()
	}
	wg.Wait()
	var applied, current int
	appliedAll := regexp.MustCompile(`^applied [0-9]+ migration\(s\) to schema "jobreaper": 1, 2, 3(, [0-9]+)*\n$`)
	for _, r := range results {
		requireExit(t, r, exitOK)
		switch {
		case appliedAll.MatchString(r.stdout):
			applied++
		case r.stdout == `schema "jobreaper" is up to date: no migration applied`+"\n":
			current++
		default:
			t.Fatalf("migrate printed %q", r.stdout)
		}
	}
	if applied != 1 || current != 1 {
		t.Fatalf("%d runs applied the migrations and %d found the schema current, want 1 and 1", applied, current)
	}
	for _, table := range []string{"jobs", "job_types", "job_events", "job_batches", jobs.SchemaVersionTable} {
		if n := count(`SELECT count(*) FROM pg_tables WHERE tablename = $1 AND schemaname = $2`, table, schema); n != 1 {
			t.Errorf("%s.%s exists %d times, want once", schema, table, n)
		}
		if n := count(`SELECT count(*) FROM pg_tables WHERE tablename = $1 AND schemaname <> $2`, table, schema); n != 0 {
			t.Errorf("%s exists in %d other schemas, want none", table, n)
		}
	}

	// Decoys in public, as a pooled connection's search_path would find
	// them: a statement relying on search_path would change them.
	if _, err := jobs.Migrate(ctx, direct, "public"); err != nil {
		t.Fatal(err)
	}
	q, id := unique("pooled"), unique("J40")
	if _, err := direct.Exec(ctx, `INSERT INTO jobreaper.job_types (name, max_runtime) VALUES ('report.export', '30 minutes')`); err != nil {
		t.Fatal(err)
	}
	if _, err := direct.Exec(ctx, `INSERT INTO jobreaper.jobs (id, type, status, generation, queue, worker, started_at, updated_at)
VALUES ($1, 'report.export', 'PROCESSING', 1, $2, 'W1', now() - interval '31 minutes', now() - interval '21 minutes')`, id, q); err != nil {
		t.Fatal(err)
	}
	activeTask(t, id, q)
	rdb := realRedis(t)
	t.Cleanup(func() { rdb.Del(context.WithoutCancel(ctx), queue.MarkerKey(id)) })

	// A wrong schema name stops the daemon at start, naming the fix.
	wrong := run(t, "run", "--once", "--database-url", pooled, "--schema", "jobreapr",
		"--redis-url", redisTestURL(), "--queues", q)
	requireExit(t, wrong, exitCannotRun)
	requireOneLineError(t, wrong, `schema "jobreapr" has no jobreaper tables`, "jobreaper migrate --schema jobreapr")

	r := run(t, "run", "--once", "--output", "json", "--database-url", pooled, "--schema", schema,
		"--redis-url", redisTestURL(), "--queues", q)
	requireExit(t, r, exitOK)
	if doc := requireOneJSONResult(t, r.stdout); string(doc["scanned"]) != "1" || string(doc["reaped"]) != "1" || string(doc["errors"]) != "0" {
		t.Fatalf("result %s, want 1 scanned, 1 reaped, 0 errors", r.stdout)
	}
	if n := count(`SELECT count(*) FROM jobreaper.jobs WHERE id = $1 AND status = 'FAILED'
   AND failure_reason = 'stalled' AND marker_set_at IS NOT NULL`, id); n != 1 {
		t.Errorf("job %s is not FAILED stalled with its marker confirmed", id)
	}
	if n := count(`SELECT count(*) FROM jobreaper.job_events WHERE job_id = $1 AND kind = 'reaped'
   AND (detail->>'generation')::bigint = 1`, id); n != 1 {
		t.Errorf("reaped events of %s with generation 1 in its detail = %d, want 1", id, n)
	}
	if n, err := rdb.Exists(ctx, queue.MarkerKey(id)).Result(); err != nil || n != 1 {
		t.Errorf("marker %s: exists=%d err=%v, want 1", queue.MarkerKey(id), n, err)
	}
	for _, table := range []string{"jobs", "job_types", "job_events", "job_batches"} {
		if n := count(`SELECT count(*) FROM public.` + table); n != 0 {
			t.Errorf("public.%s holds %d rows, want 0", table, n)
		}
	}
	if strings.Contains(r.stderr, "level=ERROR") {
		t.Errorf("the pass logged errors: %s", r.stderr)
	}
}
