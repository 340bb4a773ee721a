package jobstest

import (
	"context"
	"strconv"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/jobreaper/jobreaper/jobs"
)

// PooledSchema is the schema NewPooled migrates for the pooled tests: not
// public.
const PooledSchema = "jobreaper"

// Pooled is a database of the test's own with jobreaper migrated into
// PooledSchema and, as decoys, into public (the same tables, so that a
// statement falling back to search_path would run without an error and
// leave its rows there), plus a PgBouncer in front of it.
type Pooled struct {
	// Name is the database's name; Direct a pool on it, not through the
	// pooler; PgBouncer the pooler in front of it.
	Name      string
	Direct    *pgxpool.Pool
	PgBouncer *PgBouncer
}

// NewPooled creates the database, migrates it and starts its pooler, all
// removed when the test ends.
func NewPooled(t testing.TB, opts PgBouncerOptions) *Pooled {
	t.Helper()
	ctx := context.Background()
	name, directURL := NewDatabase(t)
	direct, err := pgxpool.New(ctx, directURL)
	noErr(t, err)
	t.Cleanup(direct.Close)
	for _, schema := range []string{"public", PooledSchema} {
		if _, err := jobs.Migrate(ctx, direct, schema); err != nil {
			t.Fatalf("migrating %s: %v", schema, err)
		}
	}
	// The pooler is stopped before the database is dropped (cleanups run
	// last registered first).
	return &Pooled{Name: name, Direct: direct, PgBouncer: StartPgBouncer(t, opts)}
}

// Connect opens a pool through the pooler as a worker would: the URL
// setting docs/schema.md documents for pooled URLs, and a search_path the
// pooler ignores.
func (s *Pooled) Connect(t testing.TB, maxConns int) *pgxpool.Pool {
	t.Helper()
	pool, err := jobs.Connect(context.Background(), s.PgBouncer.URL(s.Name,
		"default_query_exec_mode=exec", "search_path="+PooledSchema, "pool_max_conns="+strconv.Itoa(maxConns)), PooledSchema)
	noErr(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// Count runs a count query on the direct connection.
func (s *Pooled) Count(t testing.TB, sql string, args ...any) int64 {
	t.Helper()
	var n int64
	if err := s.Direct.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

// RequirePublicUntouched fails the test when any of jobreaper's tables in
// public holds a row.
func (s *Pooled) RequirePublicUntouched(t testing.TB) {
	t.Helper()
	for _, table := range []string{"jobs", "job_types", "job_events", "job_batches"} {
		if n := s.Count(t, "SELECT count(*) FROM public."+table); n != 0 {
			t.Errorf("public.%s holds %d rows, want 0: a statement relied on search_path", table, n)
		}
	}
}
