package jobs_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jonboulle/clockwork"

	"github.com/jobreaper/jobreaper/internal/pgcore"
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

// epoch is where every fake clock starts; only differences matter.
var epoch = time.Date(2026, 3, 2, 9, 0, 0, 0, time.UTC)

// baselineTypes inserts the CASES baseline job types.
func baselineTypes(t *testing.T, db *jobstest.DB) {
	t.Helper()
	db.JobType(t, "report.export", "30 minutes", "", "")
	db.JobType(t, "crawl.site", "60 minutes", "", "")
	db.JobType(t, "video.transcode", "120 minutes", "", "")
}

// setup returns a fresh schema with the baseline types and a Store over it
// running cascades.
func setup(t *testing.T, cascades jobs.Cascades) (*jobstest.DB, *jobs.Store) {
	t.Helper()
	db := jobstest.New(t)
	baselineTypes(t, db)
	return db, db.Store(jobs.WithCascades(cascades))
}

// claim claims job id at expected generation for worker.
func claim(t *testing.T, store *jobs.Store, id string, expected int64, worker string) jobs.Lease {
	t.Helper()
	lease, err := store.Claim(context.Background(), id, expected, worker)
	if err != nil {
		t.Fatalf("claiming %s at generation %d: %v", id, expected, err)
	}
	return lease
}

// queued inserts a QUEUED job with an optional total and claims it as
// generation 1 for worker.
func queued(t *testing.T, db *jobstest.DB, store *jobs.Store, j jobstest.Job, worker string) jobs.Lease {
	t.Helper()
	j.Status = jobs.StatusQueued
	db.Insert(t, j)
	return claim(t, store, j.ID, j.Generation, worker)
}

// backdate moves job id's attempt start and last progress into the past,
// on the database clock, as if the attempt had run that long.
func backdate(t *testing.T, db *jobstest.DB, id string, startedAgo, idleAgo time.Duration) {
	t.Helper()
	db.Exec(t, `UPDATE jobs SET started_at = now() - $2::interval, updated_at = now() - $3::interval WHERE id = $1`,
		id, pgcore.Interval(startedAgo), pgcore.Interval(idleAgo))
}

// reap does what the reaper does for one job: read the row, then reap with
// that evidence (the reap re-checks the whole rule in SQL).
func reap(t *testing.T, store *jobs.Store, id string) bool {
	t.Helper()
	sn, err := store.Get(context.Background(), id)
	if err != nil {
		t.Fatalf("reading %s: %v", id, err)
	}
	reaped, _, err := jobs.DaemonOf(store).Reap(context.Background(), pgstore.ReapParams{
		JobID: id, Generation: sn.Generation, UpdatedAt: sn.UpdatedAt, Reason: jobs.ReasonStalled, Rule: rule,
	})
	if err != nil {
		t.Fatalf("reaping %s: %v", id, err)
	}
	return reaped
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

// requireLate fails the test unless job id has exactly the late results
// listed as operation/code pairs, in order.
func requireLate(t *testing.T, db *jobstest.DB, id string, want ...[2]string) []jobs.LateResultDetail {
	t.Helper()
	got := db.LateResults(t, id)
	if len(got) != len(want) {
		t.Fatalf("job %s has %d late_result_rejected events %+v, want %d", id, len(got), got, len(want))
	}
	for i, w := range want {
		if got[i].Operation != w[0] || got[i].Code != w[1] {
			t.Fatalf("late result %d of %s = %s/%s, want %s/%s", i, id, got[i].Operation, got[i].Code, w[0], w[1])
		}
	}
	return got
}

// countWrites installs a trigger that records every heartbeat write to
// jobs (an UPDATE that moves progress_mark within one generation: no other
// write does; a claim resets the mark as it moves the generation) into
// heartbeat_writes, with the attempt's generation, so tests count real
// UPDATEs instead of trusting a counter of the code under test.
func countWrites(t *testing.T, db *jobstest.DB) {
	t.Helper()
	db.Exec(t, `
CREATE TABLE heartbeat_writes (job_id text NOT NULL, generation bigint NOT NULL, progress_mark bigint NOT NULL);
CREATE FUNCTION record_heartbeat_write() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO heartbeat_writes (job_id, generation, progress_mark) VALUES (NEW.id, NEW.generation, NEW.progress_mark);
    RETURN NEW;
END $$;
CREATE TRIGGER heartbeat_writes AFTER UPDATE ON jobs FOR EACH ROW
    WHEN (OLD.progress_mark IS DISTINCT FROM NEW.progress_mark AND OLD.generation = NEW.generation)
    EXECUTE FUNCTION record_heartbeat_write();`)
}

// writes returns how many heartbeat writes job id received (see countWrites).
func writes(t *testing.T, db *jobstest.DB, id string) int64 {
	t.Helper()
	return db.Count(t, `SELECT count(*) FROM heartbeat_writes WHERE job_id = $1`, id)
}

// heartbeater returns a Heartbeater with the default interval on a fake
// clock.
func heartbeater(t *testing.T, store *jobs.Store) (*jobs.Heartbeater, *clockwork.FakeClock) {
	t.Helper()
	clock := clockwork.NewFakeClockAt(epoch)
	hb, err := jobs.NewHeartbeater(store, clock, 0)
	if err != nil {
		t.Fatal(err)
	}
	return hb, clock
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

// checkMigrated is the start check of schema on pool, as the daemon and a
// worker make it (Store.CheckSchema).
func checkMigrated(ctx context.Context, pool jobs.DB, schema string) error {
	return jobs.NewStore(pool, jobs.WithSchema(schema)).CheckSchema(ctx)
}
