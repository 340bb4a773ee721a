package pgstore

import (
	"context"
	"errors"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/jobreaper/jobreaper/internal/pgcore"
)

// ConnWatch notes, for the reaper daemon's outage grace, when the
// connections of one pool to PostgreSQL were lost (connectionLost: a dial
// refused or timed out, a connection reset, closed or cut short, never a
// server's answer to a statement) and when the first statement after such a
// failure went through. Store.PassClock records that moment, on the
// database clock, as the end of an outage.
//
// It is a pgx tracer: Install puts it on the pool's configuration, where it
// sees every connect and the end of every statement, batch and COPY of the
// pool, whoever sends them (the pass, the leader lease, the readiness
// check); a statement's own retries or a statement that failed inside an
// operation that later succeeded are seen too. Give the same ConnWatch to
// the Store with WithConnWatch. It is safe for concurrent use.
type ConnWatch struct {
	slowConnect time.Duration

	mu sync.Mutex
	// lost counts the connection-level failures seen; covered is the count
	// the last record (Store.PassClock) accounted for.
	lost, covered uint64
	// down is true from a failure until the next good statement; backAt is
	// when (this host's monotonic clock) the first good statement after the
	// last failure ended, zero while down.
	down   bool
	backAt time.Time
}

// NewConnWatch returns a ConnWatch. slowConnect is the longest a connect
// may take before it counts as a connect timeout even when it succeeds in
// the end (a dial that waited out a network partition); give the
// operation timeout (a statement waiting that long for its connection has
// failed already). 0 counts only connects that fail.
func NewConnWatch(slowConnect time.Duration) *ConnWatch {
	return &ConnWatch{slowConnect: slowConnect}
}

// Install makes w the tracer of the pool cfg configures, replacing any
// tracer set there. Call it before the pool is created (jobs.Connect takes
// it as an argument).
func (w *ConnWatch) Install(cfg *pgxpool.Config) { cfg.ConnConfig.Tracer = w }

// note records a statement's outcome: a success, a connection-level
// failure, or neither (a server's error says nothing about the connection).
func (w *ConnWatch) note(err error) {
	switch {
	case err == nil:
		w.good()
	case pgcore.ConnectionLost(err):
		w.fail()
	}
}

func (w *ConnWatch) fail() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.lost++
	w.down, w.backAt = true, time.Time{}
}

func (w *ConnWatch) good() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.down {
		w.down, w.backAt = false, time.Now()
	}
}

// pending returns whether failures were seen since the last record, the
// failure count to pass to cover once recorded, and how long ago the first
// good statement after the last of them ended (0 while no statement has
// gone through since). A nil ConnWatch has nothing pending.
func (w *ConnWatch) pending() (seq uint64, ago time.Duration, ok bool) {
	if w == nil {
		return 0, 0, false
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.lost == w.covered {
		return 0, 0, false
	}
	if !w.down {
		ago = time.Since(w.backAt)
	}
	return w.lost, ago, true
}

// cover marks the failures up to seq as recorded.
func (w *ConnWatch) cover(seq uint64) {
	if w == nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.covered = max(w.covered, seq)
}

type connectStartKey struct{}

// TraceConnectStart implements pgx.ConnectTracer.
func (w *ConnWatch) TraceConnectStart(ctx context.Context, _ pgx.TraceConnectStartData) context.Context {
	return context.WithValue(ctx, connectStartKey{}, time.Now())
}

// TraceConnectEnd implements pgx.ConnectTracer: a connect that failed at
// the connection level, or took longer than slowConnect, is a failure; a
// connect that succeeded is a good statement after it.
func (w *ConnWatch) TraceConnectEnd(ctx context.Context, data pgx.TraceConnectEndData) {
	if data.Err != nil {
		w.note(data.Err)
		return
	}
	if start, ok := ctx.Value(connectStartKey{}).(time.Time); ok && w.slowConnect > 0 && time.Since(start) > w.slowConnect {
		w.fail()
	}
	w.good()
}

// TraceQueryStart implements pgx.QueryTracer.
func (w *ConnWatch) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return ctx
}

// TraceQueryEnd implements pgx.QueryTracer.
func (w *ConnWatch) TraceQueryEnd(_ context.Context, _ *pgx.Conn, data pgx.TraceQueryEndData) {
	w.note(data.Err)
}

// TraceBatchStart implements pgx.BatchTracer.
func (w *ConnWatch) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}

// TraceBatchQuery implements pgx.BatchTracer: a statement of a batch that
// lost its connection is a failure (the batch's end reports it too).
func (w *ConnWatch) TraceBatchQuery(_ context.Context, _ *pgx.Conn, data pgx.TraceBatchQueryData) {
	if pgcore.ConnectionLost(data.Err) {
		w.fail()
	}
}

// TraceBatchEnd implements pgx.BatchTracer.
func (w *ConnWatch) TraceBatchEnd(_ context.Context, _ *pgx.Conn, data pgx.TraceBatchEndData) {
	w.note(data.Err)
}

// TraceCopyFromStart implements pgx.CopyFromTracer.
func (w *ConnWatch) TraceCopyFromStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceCopyFromStartData) context.Context {
	return ctx
}

// TraceCopyFromEnd implements pgx.CopyFromTracer.
func (w *ConnWatch) TraceCopyFromEnd(_ context.Context, _ *pgx.Conn, data pgx.TraceCopyFromEndData) {
	w.note(data.Err)
}

// WithConnWatch makes Store.PassClock record an outage end after the
// connection-level failures w saw (w must be installed on the pool the
// Store runs on: ConnWatch.Install).
func WithConnWatch(w *ConnWatch) Option {
	return func(o *options) { o.watch = w }
}

// PassClockParams say how Store.PassClock reads the clock.
type PassClockParams struct {
	// Grace reads and records the outage end; false reads now() alone and
	// leaves PassClock.OutageEnd zero (the outage grace off).
	Grace bool
	// Record writes what the record rules find; false (a dry run) only
	// computes the outage end they would record.
	Record bool
	// RecordedBy names who records, for reaper_outages.recorded_by
	// (host:pid).
	RecordedBy string
}

// PassClock is a pass's one reading of the database clock.
type PassClock struct {
	// Now is the database's now().
	Now time.Time
	// OutageEnd is the end of the last PostgreSQL outage, on the database
	// clock, as recorded after this call (or as it would be, when not
	// recording); zero without the grace.
	OutageEnd time.Time
	// Cause says why this call moved the outage end: first_record,
	// connection_lost, restart, timeline_change or server_change; "" when it
	// did not.
	Cause string
	// TimelineRefused is true on the call that found pg_control_checkpoint()
	// refused to this role (a managed service may revoke it): from then on
	// the Store reads no timeline, and a promotion is seen only through the
	// other rules. Later calls return false, so the caller warns once.
	TimelineRefused bool
}

// passClockSQL reads now(), the outage row, pg_postmaster_start_time() and
// the timeline ({timeline}) in one statement, and records a new outage end
// when one of the rules holds (in this order of cause):
//
//   - no row yet (first_record): the postmaster start, so that jobs idle
//     since before a PostgreSQL that started less than a stall timeout ago
//     are held;
//   - another timeline than recorded (timeline_change: a promotion after a
//     failover): now(), replacing the recorded end (the new server's clock
//     may run behind the old one's);
//   - an earlier postmaster start than recorded (server_change: another
//     server answers, as after a failover where no timeline can be read):
//     now(), likewise;
//   - a later postmaster start (restart): the postmaster start;
//   - connection-level failures this daemon saw (@lost): the end of its
//     first good statement after them (now() - @lost_ago), when that is
//     later than the recorded end.
//
// Outside the first two causes the recorded end only moves forward, also
// against a concurrent record (ON CONFLICT). Nothing is written without a
// cause or without @record.
const passClockSQL = `
WITH seen AS (
    SELECT now() AS now, pg_postmaster_start_time() AS started, {timeline} AS timeline
), judged AS (
    SELECT s.now, s.started, s.timeline, o.outage_end AS recorded_end,
           CASE WHEN o.database IS NULL THEN 'first_record'
                WHEN s.timeline <> o.timeline THEN 'timeline_change'
                WHEN s.started < o.postmaster_start THEN 'server_change'
                WHEN s.started > o.postmaster_start THEN 'restart'
                WHEN @lost AND s.now - @lost_ago::interval > o.outage_end THEN 'connection_lost'
           END AS cause
      FROM seen s LEFT JOIN {schema}.reaper_outages o ON o.database = current_database()
), ended AS (
    SELECT j.*,
           CASE WHEN j.cause IS NULL THEN j.recorded_end
                ELSE greatest(CASE WHEN j.cause IN ('timeline_change', 'server_change') THEN j.now ELSE j.recorded_end END,
                              CASE WHEN j.cause IN ('first_record', 'restart') THEN j.started END,
                              CASE WHEN @lost THEN j.now - @lost_ago::interval END)
           END AS outage_end
      FROM judged j
), recorded AS (
    INSERT INTO {schema}.reaper_outages AS o (database, outage_end, cause, timeline, postmaster_start, recorded_by, recorded_at)
    SELECT current_database(), e.outage_end, e.cause, e.timeline, e.started, @recorded_by, e.now
      FROM ended e
     WHERE @record AND e.cause IS NOT NULL
    ON CONFLICT (database) DO UPDATE
       SET outage_end = CASE WHEN excluded.cause IN ('timeline_change', 'server_change') THEN excluded.outage_end
                             ELSE greatest(o.outage_end, excluded.outage_end) END,
           cause = excluded.cause,
           timeline = coalesce(excluded.timeline, o.timeline),
           postmaster_start = excluded.postmaster_start,
           recorded_by = excluded.recorded_by,
           recorded_at = excluded.recorded_at
    RETURNING o.outage_end
)
SELECT e.now, coalesce((SELECT r.outage_end FROM recorded r), e.outage_end), coalesce(e.cause, '')
  FROM ended e`

// The two forms of passClockSQL: with the timeline, and without it once
// PostgreSQL refused pg_control_checkpoint() to this role.
var (
	passClockTimelineSQL   = strings.Replace(passClockSQL, "{timeline}", "(SELECT timeline_id FROM pg_catalog.pg_control_checkpoint())::bigint", 1)
	passClockNoTimelineSQL = strings.Replace(passClockSQL, "{timeline}", "NULL::bigint", 1)
)

// PassClock is a pass's one clock reading, in one round trip: the
// database's now() and, with p.Grace, the end of the last PostgreSQL
// outage, recorded first when a rule of passClockSQL says the outage end
// moved (a first record, connection-level failures the Store's ConnWatch
// saw since its last record, a restart, a promotion). A daemon's or a
// manual pass's own start is no outage end. With p.Record false (a dry
// run) nothing is written and OutageEnd is the value the rules would
// record.
//
// When PostgreSQL refuses pg_control_checkpoint() to this role, the
// statement is sent again without the timeline (one more round trip, once
// per Store) and PassClock.TimelineRefused tells the caller to warn.
//
// It returns a wrapped driver error when PostgreSQL fails (a role without
// the grants of deploy/sql/roles.sql on reaper_outages, among others).
func (s *Store) PassClock(ctx context.Context, p PassClockParams) (PassClock, error) {
	ctx, done := s.core.Op(ctx, "PassClock")
	var c PassClock
	if !p.Grace {
		err := s.core.DB().QueryRow(ctx, `SELECT now()`).Scan(&c.Now)
		return c, done(err)
	}
	seq, ago, lost := s.watch.pending()
	args := pgx.NamedArgs{"lost": lost, "lost_ago": pgcore.Interval(ago), "record": p.Record, "recorded_by": p.RecordedBy}
	read := func(sql string) error {
		return s.core.DB().QueryRow(ctx, s.core.Q(sql), args).Scan(&c.Now, &c.OutageEnd, &c.Cause)
	}
	var err error
	if s.noTimeline.Load() {
		err = read(passClockNoTimelineSQL)
	} else if err = read(passClockTimelineSQL); timelineRefused(err) {
		c.TimelineRefused = s.noTimeline.CompareAndSwap(false, true)
		err = read(passClockNoTimelineSQL)
	}
	if err == nil && p.Record {
		s.watch.cover(seq)
	}
	return c, done(err)
}

// timelineRefused reports whether err is PostgreSQL's permission error on
// pg_control_checkpoint().
func timelineRefused(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "42501" && strings.Contains(pgErr.Message, "pg_control_checkpoint")
}
