package queue_test

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/jobreaper/jobreaper/internal/asynqstate"
	"github.com/jobreaper/jobreaper/internal/pgstore"
	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
	"github.com/jobreaper/jobreaper/queue"
	"github.com/jobreaper/jobreaper/queue/redistest"
)

// raceRule is the stall rule of the passes of an interleaving whose plan
// draws stall: every job type's max_runtime is 1 microsecond, so a job is
// stalled once it made no progress for stall.
func raceRule(stall time.Duration) pgstore.StallRule {
	return pgstore.StallRule{DefaultStallTimeout: stall, MinStallTimeout: time.Microsecond, DefaultHardTimeout: jobs.HardTimeoutDefault}
}

// raceSchema records, with the transaction that made it, every write of
// the jobs table (race_writes) and of job_batches (race_batches), and the
// cascades that ran (race_cascades): the checks join them with job_events
// and the product rows by transaction to tell which attempt's generation
// made each write.
const raceSchema = `
CREATE TABLE race_writes (
    seq         bigserial PRIMARY KEY,
    tx          xid8 NOT NULL DEFAULT pg_current_xact_id(),
    at          timestamptz NOT NULL DEFAULT now(),
    op          text NOT NULL,
    job_id      text NOT NULL,
    old_status  text,        new_status  text,
    old_gen     bigint,      new_gen     bigint,
    old_first   bigint,      new_first   bigint,
    old_cursor  bigint,      new_cursor  bigint,
    old_total   bigint,      new_total   bigint,
    old_mark    bigint,      new_mark    bigint,
    old_updated timestamptz, new_updated timestamptz,
    old_started timestamptz, new_started timestamptz,
    old_reason  text,        new_reason  text);
CREATE INDEX ON race_writes (job_id);
CREATE FUNCTION race_record_write() RETURNS trigger LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    INSERT INTO race_writes (op, job_id, old_status, new_status, old_gen, new_gen, old_first, new_first,
                             old_cursor, new_cursor, old_total, new_total, old_mark, new_mark,
                             old_updated, new_updated, old_started, new_started, old_reason, new_reason)
    VALUES (TG_OP, coalesce(NEW.id, OLD.id), OLD.status, NEW.status, OLD.generation, NEW.generation,
            OLD.first_generation, NEW.first_generation, OLD."cursor", NEW."cursor", OLD.total, NEW.total,
            OLD.progress_mark, NEW.progress_mark, OLD.updated_at, NEW.updated_at,
            OLD.started_at, NEW.started_at, OLD.failure_reason, NEW.failure_reason);
    RETURN NULL;
END $$;
CREATE TRIGGER race_record_write AFTER INSERT OR UPDATE OR DELETE ON jobs
    FOR EACH ROW EXECUTE FUNCTION race_record_write();

CREATE TABLE race_batches (
    tx              xid8 NOT NULL DEFAULT pg_current_xact_id(),
    job_id          text NOT NULL,
    token           text NOT NULL,
    generation      bigint NOT NULL,
    expected_cursor bigint NOT NULL,
    count           bigint NOT NULL,
    cursor_after    bigint NOT NULL);
CREATE INDEX ON race_batches (job_id);
CREATE FUNCTION race_record_batch() RETURNS trigger LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    INSERT INTO race_batches (job_id, token, generation, expected_cursor, count, cursor_after)
    VALUES (NEW.job_id, NEW.token, NEW.generation, NEW.expected_cursor, NEW.count, NEW.cursor_after);
    RETURN NULL;
END $$;
CREATE TRIGGER race_record_batch AFTER INSERT OR UPDATE ON job_batches
    FOR EACH ROW EXECUTE FUNCTION race_record_batch();

CREATE TABLE race_cascades (job_id text NOT NULL, hook text NOT NULL, generation bigint NOT NULL);
CREATE INDEX ON race_cascades (job_id);
CREATE INDEX ON items (job_id);
CREATE INDEX ON chapters (job_id);
CREATE INDEX ON usage (job_id);`

// raceCascades record, for every type, each cascade run with the
// generation the row had in the cascade's transaction.
func raceCascades() jobs.Cascades {
	c := jobs.Cascades{}
	for f := range flowCount {
		c[f.jobType()] = jobs.Cascade{
			OnCompleted: []string{`INSERT INTO race_cascades (job_id, hook, generation) SELECT id, 'completed', generation FROM jobs WHERE id = @job_id`},
			OnFailed:    []string{`INSERT INTO race_cascades (job_id, hook, generation) SELECT id, 'failed', generation FROM jobs WHERE id = @job_id`},
		}
	}
	return c
}

// raceSuite is what every interleaving of one test shares: one schema,
// one Redis, the Store, the reaper's lister and the workers' Heartbeaters.
type raceSuite struct {
	db *jobstest.DB
	// wide is db on a pool with room for every goroutine of an
	// interleaving, for the product's own statements (jobstest's flows).
	wide  *jobstest.DB
	store *jobs.Store
	// daemon is the reaper's and the operator commands' store over the
	// same pool and cascades.
	daemon  *pgstore.Store
	rc      *redis.Client
	markers *queue.MarkerStore
	// writer writes markers as the reaper does.
	writer *asynqstate.MarkerWriter
	lister *asynqstate.IDLister
	asynq  *asynqstate.StatusReader
	hbs    [workers]*jobs.Heartbeater
	// next numbers the interleavings, for job IDs that no other
	// interleaving (or shrinking run) of the test uses.
	next atomic.Int64
	// seen counts, over all interleavings, the writes that landed by kind
	// and the refusals, to show that the suite exercised each race.
	seenMu sync.Mutex
	seen   map[string]int
}

func newRaceSuite(t *testing.T) *raceSuite {
	t.Helper()
	ctx := context.Background()
	db := jobstest.New(t)
	for f := range flowCount {
		db.JobType(t, f.jobType(), "1 microsecond", "", "")
	}
	db.Exec(t, jobstest.CourseSchema)
	db.Exec(t, jobstest.VideoSchema)
	db.Exec(t, jobstest.ItemsTable)
	db.Exec(t, raceSchema)

	// Every goroutine of an interleaving may hold a transaction at once;
	// late_result_rejected events go through a pool of their own, as
	// jobs.WithEventsDB advises when callers hold transactions.
	pool := connect(t, db, 24)
	events := connect(t, db, 8)
	wide := *db
	wide.Pool = pool
	s := &raceSuite{db: db, wide: &wide, seen: map[string]int{}}
	s.store = jobs.NewStore(pool, jobs.WithSchema(db.Schema), jobs.WithCascades(raceCascades()), jobs.WithEventsDB(events))
	s.daemon = pgstore.New(pool, pgstore.WithSchema(db.Schema), pgstore.WithCascades(raceCascades()))
	if err := s.store.PrepareCascades(ctx); err != nil {
		t.Fatal(err)
	}

	srv := redistest.Start(t)
	s.rc = srv.Client(t)
	var err error
	s.writer = asynqstate.NewMarkerWriter(s.rc, 0)
	if s.markers, err = queue.NewMarkerStore(s.rc); err != nil {
		t.Fatal(err)
	}
	if s.lister, err = asynqstate.NewIDLister(s.rc); err != nil {
		t.Fatal(err)
	}
	s.asynq = asynqstate.NewStatusReader(s.rc, 0)
	serveRaceLiveQueue(t, s.rc, s.asynq)
	for w := range s.hbs {
		// One Heartbeater per worker process; its limiter lets every call
		// through, so that heartbeats race as often as batches do.
		if s.hbs[w], err = jobs.NewHeartbeater(s.store, nil, time.Nanosecond); err != nil {
			t.Fatal(err)
		}
	}
	return s
}

// serveRaceLiveQueue runs an asynq server serving raceLiveQueue on rc,
// stopped at cleanup, enqueues one task there (asynq knows a queue from
// its first enqueue) and waits until the server is live.
func serveRaceLiveQueue(t *testing.T, rc *redis.Client, reader *asynqstate.StatusReader) {
	t.Helper()
	srv := asynq.NewServerFromRedisClient(rc, asynq.Config{Queues: map[string]int{raceLiveQueue: 1},
		LogLevel: asynq.FatalLevel, ShutdownTimeout: time.Second})
	if err := srv.Start(asynq.HandlerFunc(func(context.Context, *asynq.Task) error { return nil })); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	if _, err := asynq.NewClientFromRedisClient(rc).EnqueueContext(t.Context(), asynq.NewTask("noop", nil),
		asynq.Queue(raceLiveQueue)); err != nil {
		t.Fatal(err)
	}
	jobstest.Eventually(t, "a live asynq server serves "+raceLiveQueue, func() bool {
		live, err := reader.LiveQueues(t.Context())
		return err == nil && live[raceLiveQueue]
	})
}

func connect(t *testing.T, db *jobstest.DB, conns int) *pgxpool.Pool {
	t.Helper()
	pool, err := jobs.Connect(context.Background(), db.URL+"&pool_max_conns="+strconv.Itoa(conns), db.Schema)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}
