// Package jobstest gives each test its own PostgreSQL schema with
// jobreaper's tables migrated, dropped again when the test ends. Tests that
// use it run in parallel without seeing each other's rows.
package jobstest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/jobreaper/jobreaper/internal/pgcore"
	"github.com/jobreaper/jobreaper/internal/pgstore"
	"github.com/jobreaper/jobreaper/jobs"
)

// DatabaseURLDefault is the test database used when
// JOBREAPER_TEST_DATABASE_URL is unset.
const DatabaseURLDefault = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"

// DatabaseURL returns the test database URL: JOBREAPER_TEST_DATABASE_URL or
// DatabaseURLDefault.
func DatabaseURL() string {
	if u := os.Getenv("JOBREAPER_TEST_DATABASE_URL"); u != "" {
		return u
	}
	return DatabaseURLDefault
}

// DB is one test's schema.
type DB struct {
	// Pool's connections use Schema as their search_path (sent by the
	// URL), so that a test's own product tables, created unqualified, land
	// in Schema; jobreaper's statements name Schema themselves (Store).
	Pool   *pgxpool.Pool
	Schema string
	// URL is DatabaseURL with search_path set to Schema, for code under test
	// that connects by itself (the CLI).
	URL string
}

// Store returns a jobs.Store over Pool on the test's schema, with opts
// applied after jobs.WithSchema.
func (d *DB) Store(opts ...jobs.StoreOption) *jobs.Store {
	return jobs.NewStore(d.Pool, append([]jobs.StoreOption{jobs.WithSchema(d.Schema)}, opts...)...)
}

// Table returns jobreaper's table name qualified with the test's schema
// ("schema".jobs), for tests that write or read jobreaper's tables with
// their own SQL.
func (d *DB) Table(name string) string {
	return pgx.Identifier{d.Schema, name}.Sanitize()
}

// New creates a fresh schema named after t, migrates it, and registers its
// removal with t.Cleanup. It fails the test (never skips it) when PostgreSQL
// is not reachable, saying what to start.
func New(t testing.TB) *DB {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	schema := SchemaName(t)
	sep := "?"
	if strings.Contains(DatabaseURL(), "?") {
		sep = "&"
	}
	url := DatabaseURL() + sep + "search_path=" + schema
	pool, err := jobs.Connect(ctx, url, schema)
	if err != nil {
		t.Fatalf("PostgreSQL for tests is not reachable (%v); start it (bash .ci/test starts it) or set JOBREAPER_TEST_DATABASE_URL", err)
	}
	t.Cleanup(func() {
		pool.Close()
		admin, err := pgx.Connect(context.Background(), DatabaseURL())
		if err != nil {
			t.Errorf("dropping schema %s: %v", schema, err)
			return
		}
		defer admin.Close(context.Background())
		if _, err := admin.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE"); err != nil {
			t.Errorf("dropping schema %s: %v", schema, err)
		}
	})
	if _, err := jobs.Migrate(ctx, pool, schema); err != nil {
		t.Fatalf("migrating test schema %s: %v", schema, err)
	}
	return &DB{Pool: pool, Schema: schema, URL: url}
}

// SchemaName returns a unique schema name derived from the test's name.
func SchemaName(t testing.TB) string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	name := strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9':
			return r
		case r >= 'A' && r <= 'Z':
			return r + ('a' - 'A')
		}
		return '_'
	}, t.Name())
	if len(name) > 40 {
		name = name[:40]
	}
	return "t_" + name + "_" + hex.EncodeToString(b[:])
}

// Exec runs sql with args on the test schema and fails the test on error.
func (d *DB) Exec(t testing.TB, sql string, args ...any) {
	t.Helper()
	if _, err := d.Pool.Exec(context.Background(), sql, args...); err != nil {
		t.Fatalf("exec %q: %v", sql, err)
	}
}

// JobType inserts a job_types row. stall and hard may be "" for NULL; all
// three are PostgreSQL interval literals such as "30 minutes".
func (d *DB) JobType(t testing.TB, name, maxRuntime, stall, hard string) {
	t.Helper()
	d.Exec(t, `INSERT INTO `+d.Table("job_types")+` (name, max_runtime, stall_timeout, hard_timeout)
VALUES ($1, $2::interval, nullif($3, '')::interval, nullif($4, '')::interval)`, name, maxRuntime, stall, hard)
}

// Job describes a jobs row for Insert. Zero fields take the column default.
type Job struct {
	ID, Type string
	// Status defaults to PROCESSING.
	Status     string
	Generation int64
	Queue      string
	ParentID   string
	TenantID   string
	Worker     string
	// StartedAgo and IdleAgo place started_at and updated_at that far before
	// now(); a nil StartedAgo leaves started_at NULL.
	StartedAgo *time.Duration
	IdleAgo    time.Duration
	Total      *int64
	Cursor     int64
	// ProgressMark is the stored heartbeat mark (default 0).
	ProgressMark int64
}

// Ago is a convenience for Job.StartedAgo.
func Ago(d time.Duration) *time.Duration { return &d }

// Insert inserts j, failing the test on error.
func (d *DB) Insert(t testing.TB, j Job) {
	t.Helper()
	if j.Status == "" {
		j.Status = jobs.StatusProcessing
	}
	var started any
	if j.StartedAgo != nil {
		started = pgcore.Interval(*j.StartedAgo)
	}
	d.Exec(t, `INSERT INTO `+d.Table("jobs")+` (id, type, status, generation, queue, parent_id, tenant_id, worker,
                  started_at, updated_at, total, "cursor", progress_mark)
VALUES ($1, $2, $3, $4, nullif($5, ''), nullif($6, ''), nullif($7, ''), nullif($8, ''),
        now() - $9::interval, now() - $10::interval, $11, $12, $13)`,
		j.ID, j.Type, j.Status, j.Generation, j.Queue, j.ParentID, j.TenantID, j.Worker,
		started, pgcore.Interval(j.IdleAgo), j.Total, j.Cursor, j.ProgressMark)
}

// Row is the part of a jobs row tests assert on.
type Row struct {
	Status        string
	Generation    int64
	FailureReason string
	UpdatedAt     time.Time
	Cursor        int64
	Worker        string
	// Total is -1 when NULL.
	Total        int64
	ProgressMark int64
	// Finished: finished_at is set.
	Finished bool
	// FirstGeneration is the generation the row's life started at.
	FirstGeneration int64
}

// Read returns job id's row, failing the test when it is missing.
func (d *DB) Read(t testing.TB, id string) Row {
	t.Helper()
	var r Row
	err := d.Pool.QueryRow(context.Background(), `SELECT status, generation, coalesce(failure_reason, ''),
       updated_at, "cursor", coalesce(worker, ''), coalesce(total, -1), progress_mark, finished_at IS NOT NULL,
       first_generation
  FROM `+d.Table("jobs")+` WHERE id = $1`, id).
		Scan(&r.Status, &r.Generation, &r.FailureReason, &r.UpdatedAt, &r.Cursor, &r.Worker,
			&r.Total, &r.ProgressMark, &r.Finished, &r.FirstGeneration)
	if err != nil {
		t.Fatalf("reading job %s: %v", id, err)
	}
	return r
}

// Events returns how many job_events of kind job id has.
func (d *DB) Events(t testing.TB, id, kind string) int {
	t.Helper()
	var n int
	if err := d.Pool.QueryRow(context.Background(),
		`SELECT count(*) FROM `+d.Table("job_events")+` WHERE job_id = $1 AND kind = $2`, id, kind).Scan(&n); err != nil {
		t.Fatalf("counting %s events of %s: %v", kind, id, err)
	}
	return n
}

// Count runs sql, a query returning one integer (count(*), sum(...)), and
// fails the test on error.
func (d *DB) Count(t testing.TB, sql string, args ...any) int64 {
	t.Helper()
	var n int64
	if err := d.Pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatalf("count %q: %v", sql, err)
	}
	return n
}

// LateResults returns the details of job id's late_result_rejected events,
// oldest first.
func (d *DB) LateResults(t testing.TB, id string) []jobs.LateResultDetail {
	t.Helper()
	rows, err := d.Pool.Query(context.Background(),
		`SELECT detail FROM `+d.Table("job_events")+` WHERE job_id = $1 AND kind = 'late_result_rejected' ORDER BY id`, id)
	if err != nil {
		t.Fatalf("reading late results of %s: %v", id, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (jobs.LateResultDetail, error) {
		var d jobs.LateResultDetail
		err := r.Scan(&d)
		return d, err
	})
	if err != nil {
		t.Fatalf("reading late results of %s: %v", id, err)
	}
	return out
}

// Eventually polls cond every 20 ms until it holds, failing the test after
// 10 s with what it waited for. Tests wait for asynchronous effects (a
// daemon's pass, an asynq server's delivery) with it, never with a bare
// sleep.
func Eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after 10s waiting until %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Daemon returns the daemon's store (internal/pgstore) over Pool on the
// test's schema, with opts applied after pgstore.WithSchema.
func (d *DB) Daemon(opts ...pgstore.Option) *pgstore.Store {
	return pgstore.New(d.Pool, append([]pgstore.Option{pgstore.WithSchema(d.Schema)}, opts...)...)
}
