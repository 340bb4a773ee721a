package pgstore_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/jobreaper/jobreaper/internal/pgstore"
	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
)

// rule is the daemon-wide part of the stall rule in the CASES baseline:
// stall timeout 15 min, minimum 11 min (2 x 5-min heartbeat + 1-min scan),
// hard timeout 24 h.
var rule = pgstore.StallRule{
	DefaultStallTimeout: 15 * time.Minute,
	MinStallTimeout:     11 * time.Minute,
	DefaultHardTimeout:  24 * time.Hour,
}

// baselineTypes inserts the CASES baseline job types.
func baselineTypes(t *testing.T, db *jobstest.DB) {
	t.Helper()
	db.JobType(t, "report.export", "30 minutes", "", "")
	db.JobType(t, "crawl.site", "60 minutes", "", "")
	db.JobType(t, "video.transcode", "120 minutes", "", "")
}

type (
	// worker is the worker library's Store; daemon is this package's.
	worker = jobs.Store
	daemon = pgstore.Store
)

// testStore is a worker's Store and the daemon's over one schema, with the
// same cascades: the tests claim, complete and fail jobs as a worker does
// and reap, list and cancel them as the daemon and the operator commands
// do, through one value.
type testStore struct {
	*worker
	*daemon
}

// Get reads a job row (both stores have it: the daemon's answers, so that
// a testStore holding only the daemon's works too).
func (s *testStore) Get(ctx context.Context, id string) (jobs.Snapshot, error) {
	return s.daemon.Get(ctx, id)
}

// Schema returns the stores' schema.
func (s *testStore) Schema() string { return s.daemon.Schema() }

// PrepareCascades checks the cascades at start (both stores have them).
func (s *testStore) PrepareCascades(ctx context.Context) error { return s.daemon.PrepareCascades(ctx) }

// stores returns the worker's and the daemon's Store over db's schema, both
// running cascades; opts configure the daemon's further (a leader lease, a
// ConnWatch).
func stores(db *jobstest.DB, cascades jobs.Cascades, opts ...pgstore.Option) *testStore {
	return &testStore{
		worker: db.Store(jobs.WithCascades(cascades)),
		daemon: db.Daemon(append([]pgstore.Option{pgstore.WithCascades(cascades)}, opts...)...),
	}
}

// setup returns a fresh schema with the baseline types and the stores over
// it running cascades.
func setup(t *testing.T, cascades jobs.Cascades) (*jobstest.DB, *testStore) {
	t.Helper()
	db := jobstest.New(t)
	baselineTypes(t, db)
	return db, stores(db, cascades)
}

// claim claims job id at expected generation for worker.
func claim(t *testing.T, store *testStore, id string, expected int64, worker string) jobs.Lease {
	t.Helper()
	lease, err := store.Claim(context.Background(), id, expected, worker)
	if err != nil {
		t.Fatalf("claiming %s at generation %d: %v", id, expected, err)
	}
	return lease
}

// queued inserts a QUEUED job with an optional total and claims it as
// generation 1 for worker.
func queued(t *testing.T, db *jobstest.DB, store *testStore, j jobstest.Job, worker string) jobs.Lease {
	t.Helper()
	j.Status = jobs.StatusQueued
	db.Insert(t, j)
	return claim(t, store, j.ID, j.Generation, worker)
}

// requireIs fails the test unless err wraps target.
func requireIs(t *testing.T, err, target error) {
	t.Helper()
	if !errors.Is(err, target) {
		t.Fatalf("err = %v, want %v", err, target)
	}
}

// requireNoErr fails the test on err.
func requireNoErr(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// requireCount fails the test unless the integer query sql returns want.
func requireCount(t *testing.T, db *jobstest.DB, want int64, sql string, args ...any) {
	t.Helper()
	if got := db.Count(t, sql, args...); got != want {
		t.Fatalf("%s = %d, want %d", sql, got, want)
	}
}

// requireRow fails the test unless job id has status, generation and cursor.
func requireRow(t *testing.T, db *jobstest.DB, id, status string, generation, cursor int64) jobstest.Row {
	t.Helper()
	r := db.Read(t, id)
	if r.Status != status || r.Generation != generation || r.Cursor != cursor {
		t.Fatalf("job %s = %s gen %d cursor %d, want %s gen %d cursor %d",
			id, r.Status, r.Generation, r.Cursor, status, generation, cursor)
	}
	return r
}

// inTx runs fn in a transaction on db and commits when fn returns nil;
// otherwise it rolls back and returns fn's error.
func inTx(t *testing.T, db *jobstest.DB, fn func(tx pgx.Tx) error) error {
	t.Helper()
	tx, err := db.Pool.Begin(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	if err := fn(tx); err != nil {
		return err
	}
	return tx.Commit(context.Background())
}

func ptr[T any](v T) *T { return &v }

// conn opens a connection of its own to db's schema and returns it with
// its server process ID.
func conn(t *testing.T, db *jobstest.DB) (*pgx.Conn, uint32) {
	t.Helper()
	c, err := pgx.Connect(context.Background(), db.URL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	return c, c.PgConn().PID()
}
