package pgstore_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/jobreaper/jobreaper/internal/pgstore"
	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
)

// outageRow is the outage row of a test's schema.
type outageRow struct {
	end, started time.Time
	cause, by    string
	timeline     *int64
}

func readOutage(t *testing.T, db *jobstest.DB) outageRow {
	t.Helper()
	var r outageRow
	err := db.Pool.QueryRow(context.Background(), `SELECT outage_end, postmaster_start, cause, recorded_by, timeline FROM `+
		db.Table("reaper_outages")+` WHERE database = current_database()`).Scan(&r.end, &r.started, &r.cause, &r.by, &r.timeline)
	if err != nil {
		t.Fatalf("reading the outage row: %v", err)
	}
	return r
}

// serverFacts are what the server says of itself.
func serverFacts(t *testing.T, db *jobstest.DB) (started time.Time, timeline int64) {
	t.Helper()
	if err := db.Pool.QueryRow(context.Background(), `SELECT pg_postmaster_start_time(), (SELECT timeline_id FROM pg_control_checkpoint())`).
		Scan(&started, &timeline); err != nil {
		t.Fatal(err)
	}
	return started, timeline
}

var grace = pgstore.PassClockParams{Grace: true, Record: true, RecordedBy: "test:1"}

func passClock(t *testing.T, s *pgstore.Store, p pgstore.PassClockParams) pgstore.PassClock {
	t.Helper()
	c, err := s.PassClock(context.Background(), p)
	if err != nil {
		t.Fatalf("PassClock: %v", err)
	}
	return c
}

// The record rules of the outage end, against the real server: the first
// pass records the postmaster start; a Store's own start is no outage
// end; a restart (a later postmaster start) records the postmaster start; a
// promotion (another timeline) or another server (an earlier postmaster
// start) records now(), replacing a recorded end that lies ahead; a dry run
// computes without writing; without the grace nothing is read or written.
// A restart and a timeline change are made by editing what the row says
// it saw.
func TestPassClockRecordRules(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("FirstPassRecordsThePostmasterStartAndAStartIsNoOutageEnd", func(t *testing.T) {
		t.Parallel()
		db := jobstest.New(t)
		started, timeline := serverFacts(t, db)
		c := passClock(t, db.Daemon(), grace)
		if c.Cause != "first_record" || !c.OutageEnd.Equal(started) || c.Now.Before(started) {
			t.Fatalf("first pass = %+v, want first_record at the postmaster start %s", c, started)
		}
		r := readOutage(t, db)
		if !r.end.Equal(started) || !r.started.Equal(started) || r.cause != "first_record" || r.by != "test:1" || r.timeline == nil || *r.timeline != timeline {
			t.Fatalf("row = %+v (timeline %v), want the postmaster start %s and timeline %d", r, r.timeline, started, timeline)
		}
		// A second pass, and a pass of a Store started afresh (another
		// daemon, run --once), record nothing.
		for _, s := range []*pgstore.Store{db.Daemon(), db.Daemon(pgstore.WithConnWatch(pgstore.NewConnWatch(time.Second)))} {
			if c := passClock(t, s, grace); c.Cause != "" || !c.OutageEnd.Equal(started) {
				t.Fatalf("a later pass = %+v, want nothing recorded and the postmaster start", c)
			}
		}
	})

	t.Run("ARestartRecordsThePostmasterStart", func(t *testing.T) {
		t.Parallel()
		db := jobstest.New(t)
		started, _ := serverFacts(t, db)
		passClock(t, db.Daemon(), grace)
		db.Exec(t, `UPDATE reaper_outages SET postmaster_start = postmaster_start - interval '1 day', outage_end = outage_end - interval '1 day'`)
		c := passClock(t, db.Daemon(), grace)
		if c.Cause != "restart" || !c.OutageEnd.Equal(started) {
			t.Fatalf("after a restart = %+v, want restart at %s", c, started)
		}
		if r := readOutage(t, db); !r.started.Equal(started) || !r.end.Equal(started) || r.cause != "restart" {
			t.Fatalf("row = %+v", r)
		}
		// A recorded end later than the restart stays: an outage end only
		// moves forward.
		db.Exec(t, `UPDATE reaper_outages SET postmaster_start = postmaster_start - interval '1 day', outage_end = now() - interval '1 second'`)
		later := readOutage(t, db).end
		if c := passClock(t, db.Daemon(), grace); c.Cause != "restart" || !c.OutageEnd.Equal(later) {
			t.Fatalf("a restart before the recorded end = %+v, want the recorded end %s kept", c, later)
		}
	})

	t.Run("AnotherTimelineRecordsNowReplacingAnEndAhead", func(t *testing.T) {
		t.Parallel()
		db := jobstest.New(t)
		_, timeline := serverFacts(t, db)
		passClock(t, db.Daemon(), grace)
		// The old primary's clock ran an hour ahead of the new one's.
		db.Exec(t, `UPDATE reaper_outages SET timeline = timeline + 1, outage_end = now() + interval '1 hour'`)
		c := passClock(t, db.Daemon(), grace)
		if c.Cause != "timeline_change" || !c.OutageEnd.Equal(c.Now) {
			t.Fatalf("after a promotion = %+v, want timeline_change at now()", c)
		}
		if r := readOutage(t, db); !r.end.Equal(c.Now) || r.timeline == nil || *r.timeline != timeline {
			t.Fatalf("row = %+v (timeline %v), want now() and timeline %d", r, r.timeline, timeline)
		}
	})

	t.Run("AnEarlierPostmasterStartIsAnotherServer", func(t *testing.T) {
		t.Parallel()
		db := jobstest.New(t)
		started, _ := serverFacts(t, db)
		passClock(t, db.Daemon(), grace)
		db.Exec(t, `UPDATE reaper_outages SET postmaster_start = postmaster_start + interval '1 hour', timeline = NULL`)
		c := passClock(t, db.Daemon(), grace)
		if r := readOutage(t, db); c.Cause != "server_change" || !c.OutageEnd.Equal(c.Now) || !r.started.Equal(started) {
			t.Fatalf("after a change of server = %+v, row %+v; want server_change at now()", c, r)
		}
	})

	t.Run("ADryRunComputesAndWritesNothing", func(t *testing.T) {
		t.Parallel()
		db := jobstest.New(t)
		started, _ := serverFacts(t, db)
		dry := pgstore.PassClockParams{Grace: true, RecordedBy: "dry:1"}
		if c := passClock(t, db.Daemon(), dry); c.Cause != "first_record" || !c.OutageEnd.Equal(started) {
			t.Fatalf("dry run without a row = %+v, want the postmaster start it would record", c)
		}
		if n := db.Count(t, `SELECT count(*) FROM reaper_outages`); n != 0 {
			t.Fatalf("a dry run wrote %d rows", n)
		}
	})

	t.Run("WithoutTheGraceNothingIsReadOrWritten", func(t *testing.T) {
		t.Parallel()
		db := jobstest.New(t)
		c := passClock(t, db.Daemon(), pgstore.PassClockParams{Record: true})
		if c.Now.IsZero() || !c.OutageEnd.IsZero() || c.Cause != "" {
			t.Fatalf("without the grace = %+v, want now() alone", c)
		}
		if n := db.Count(t, `SELECT count(*) FROM reaper_outages`); n != 0 {
			t.Fatalf("wrote %d rows without the grace", n)
		}
	})

	t.Run("RefusedWithoutTheGrantsOfRolesSQL", func(t *testing.T) {
		t.Parallel()
		db := jobstest.New(t)
		tx, err := db.Pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = tx.Rollback(ctx) }()
		role := "r_" + db.Schema
		if _, err := tx.Exec(ctx, `CREATE ROLE `+pgx.Identifier{role}.Sanitize()); err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, `GRANT USAGE ON SCHEMA `+pgx.Identifier{db.Schema}.Sanitize()+` TO `+pgx.Identifier{role}.Sanitize()+
			`; SET LOCAL ROLE `+pgx.Identifier{role}.Sanitize()); err != nil {
			t.Fatal(err)
		}
		_, err = pgstore.New(tx, pgstore.WithSchema(db.Schema)).PassClock(ctx, grace)
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "42501" {
			t.Fatalf("PassClock without a grant on reaper_outages = %v, want the permission error", err)
		}
	})
}

// Rule (a): the first good statement after connection-level failures of
// the Store's pool is an outage end, however the failures were seen; a
// server's error is not, whatever it is. The pool is cut (connections
// refused, open ones closed) as one process sees a network outage.
func TestPassClockRecordsTheFirstGoodStatementAfterLostConnections(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := jobstest.New(t)
	watch := pgstore.NewConnWatch(2 * time.Second)
	cut := db.Cuttable(t, watch.Install)
	store := pgstore.New(cut.Pool, pgstore.WithSchema(db.Schema), pgstore.WithConnWatch(watch), pgstore.WithOpTimeout(2*time.Second))
	first := passClock(t, store, grace)

	// Server errors on the watched pool: a failing row, a statement
	// timeout, a statement that ran out of the caller's time.
	_, _ = cut.Pool.Exec(ctx, `SELECT 1/0`)
	_, _ = cut.Pool.Exec(ctx, `SET statement_timeout = 50; SELECT pg_sleep(1)`)
	sctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	_, _ = cut.Pool.Exec(sctx, `SELECT pg_sleep(2)`)
	cancel()
	if watch.Pending() {
		t.Fatal("server errors counted as lost connections")
	}
	if c := passClock(t, store, grace); c.Cause != "" || !c.OutageEnd.Equal(first.OutageEnd) {
		t.Fatalf("after server errors = %+v, want nothing recorded", c)
	}

	// The outage: the pass fails, then the first statement that goes
	// through after it ends it.
	cut.Cut()
	if _, err := store.PassClock(ctx, grace); err == nil {
		t.Fatal("PassClock went through a cut pool")
	}
	if !watch.Pending() {
		t.Fatal("the refused connections were not seen")
	}
	cut.Restore()
	before := passClock(t, db.Daemon(), pgstore.PassClockParams{}).Now
	c := passClock(t, store, grace)
	if c.Cause != "connection_lost" || c.OutageEnd.Before(before) || c.OutageEnd.After(c.Now) || watch.Pending() {
		t.Fatalf("after the outage = %+v, want connection_lost at the pass's own statement (after %s)", c, before)
	}
	if c2 := passClock(t, store, grace); c2.Cause != "" || !c2.OutageEnd.Equal(c.OutageEnd) {
		t.Fatalf("the next pass = %+v, want the same outage end", c2)
	}

	// Seen by another statement of the pool (the leader lease, the
	// readiness check): the end is that statement's, not the next pass's.
	cut.Cut()
	_, _ = cut.Pool.Exec(ctx, `SELECT 1`)
	cut.Restore()
	if _, err := cut.Pool.Exec(ctx, `SELECT 1`); err != nil {
		t.Fatal(err)
	}
	good := passClock(t, db.Daemon(), pgstore.PassClockParams{}).Now
	time.Sleep(3 * time.Second) // the gap between that statement and the next pass, measured below
	c3 := passClock(t, store, grace)
	if c3.Cause != "connection_lost" || c3.OutageEnd.After(good.Add(time.Second)) || c3.Now.Sub(c3.OutageEnd) < 2*time.Second {
		t.Fatalf("after an outage the readiness check saw end = %+v, want the end of its first good statement (about %s)", c3, good)
	}
}

// A role that may not call pg_control_checkpoint() (a managed service may
// revoke it): the pass goes on without the timeline, and says so once. On
// a cluster of the test's own, since the grant is the whole server's.
func TestPassClockWithoutTheTimelineSaysSoOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cluster := jobstest.StartCluster(t)
	admin, err := pgx.Connect(ctx, cluster.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	pool, err := jobs.Connect(ctx, cluster.URL, "jobreaper")
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if _, err := jobs.Migrate(ctx, pool, "jobreaper"); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Exec(ctx, `CREATE ROLE reaper LOGIN;
GRANT USAGE ON SCHEMA jobreaper TO reaper;
GRANT SELECT, INSERT, UPDATE ON jobreaper.reaper_outages TO reaper;
REVOKE EXECUTE ON FUNCTION pg_control_checkpoint() FROM PUBLIC`); err != nil {
		t.Fatal(err)
	}
	reaperPool, err := jobs.Connect(ctx, strings.Replace(cluster.URL, "postgres://postgres@", "postgres://reaper@", 1), "jobreaper")
	if err != nil {
		t.Fatal(err)
	}
	defer reaperPool.Close()
	store := pgstore.New(reaperPool, pgstore.WithSchema("jobreaper"))
	var started time.Time
	if err := admin.QueryRow(ctx, `SELECT pg_postmaster_start_time()`).Scan(&started); err != nil {
		t.Fatal(err)
	}
	c := passClock(t, store, grace)
	if !c.TimelineRefused || c.Cause != "first_record" || !c.OutageEnd.Equal(started) {
		t.Fatalf("first pass = %+v, want the timeline refused and the postmaster start recorded", c)
	}
	if c := passClock(t, store, grace); c.TimelineRefused || c.Cause != "" {
		t.Fatalf("second pass = %+v, want nothing said again and nothing recorded", c)
	}
	var timeline *int64
	if err := admin.QueryRow(ctx, `SELECT timeline FROM jobreaper.reaper_outages`).Scan(&timeline); err != nil || timeline != nil {
		t.Fatalf("recorded timeline %v (%v), want NULL", timeline, err)
	}
}
