package pgstore

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/jobreaper/jobreaper/internal/pgcore"
)

// The statements of the uncovered-queue check: which queue sets the live
// leader leases cover, and how many stalled PROCESSING jobs the queues no
// set covers hold. Together with the leader lease's own statements, since
// the check compares the leases' queue sets.

// LeaderLeaseRow is one row of leader_leases, as the uncovered-queue check
// reads it.
type LeaderLeaseRow struct {
	// Key is the queue set's key (LeaderLeaseKey): a JSON array of queue
	// names, "[]" for every queue.
	Key string
	// HolderID is the holder's LeaderLeaseHolder.ID.
	HolderID string
	// ExpiresAt is when the leader lease lapses unless renewed (the
	// database's time).
	ExpiresAt time.Time
}

// LeaderLeases is the whole leader_leases table read by one statement,
// with the database clock of that statement, so that which leases are
// live is judged on the database's clock.
type LeaderLeases struct {
	// Rows are every leader lease row, live or expired, in key order
	// (the database's collation; the check sorts again in byte order).
	Rows []LeaderLeaseRow
	// Now is the database's now() of the read.
	Now time.Time
}

// leaderLeasesSQL reads every leader lease row and the database clock in
// one row (also when the table is empty): three arrays aggregated in the
// same order. The table holds one row per queue set ever led, a handful.
const leaderLeasesSQL = `
SELECT now(),
       coalesce(array_agg(key ORDER BY key), '{}'), coalesce(array_agg(holder_id ORDER BY key), '{}'),
       coalesce(array_agg(expires_at ORDER BY key), '{}')
  FROM {schema}.leader_leases`

// ListLeaderLeases returns every leader lease row and the database clock,
// in one statement. It returns a wrapped driver error, or the operation's
// timeout, when PostgreSQL fails.
func (s *Store) ListLeaderLeases(ctx context.Context) (LeaderLeases, error) {
	ctx, done := s.core.Op(ctx, "ListLeaderLeases")
	var (
		out     LeaderLeases
		keys    []string
		holders []string
		expires []time.Time
	)
	if err := s.core.DB().QueryRow(ctx, s.core.Q(leaderLeasesSQL)).Scan(&out.Now, &keys, &holders, &expires); err != nil {
		return LeaderLeases{}, done(err)
	}
	out.Rows = make([]LeaderLeaseRow, len(keys))
	for i := range keys {
		out.Rows[i] = LeaderLeaseRow{Key: keys[i], HolderID: holders[i], ExpiresAt: expires[i]}
	}
	return out, done(nil)
}

// stalledByQueueSQL counts the stalled PROCESSING rows of the named
// queues, per queue. Like the lost-task search (lostCandidatesSQL), it
// names j.status = 'PROCESSING' itself, so that it reads the partial index
// jobs_processing_queue_idx (queue, updated_at) by queue, and bounds
// updated_at by @min_stall, which StallPredicate implies: its cost follows
// the stalled rows of those queues, not the table.
const stalledByQueueSQL = `SELECT j.queue, count(*)
  FROM {schema}.jobs j JOIN {schema}.job_types t ON t.name = j.type
 WHERE j.status = 'PROCESSING'
   AND j.queue = ANY(@queues::text[])
   AND j.updated_at <= now() - @min_stall::interval
   AND ` + StallPredicate + `
 GROUP BY j.queue`

// CountStalledByQueue returns, for each of queues that holds PROCESSING
// jobs stalled by StallPredicate under rule on the database clock, how
// many; queues without one are absent. Nothing is sent when queues is
// empty. It returns a wrapped driver error, or the operation's timeout,
// when PostgreSQL fails.
func (s *Store) CountStalledByQueue(ctx context.Context, queues []string, rule StallRule) (map[string]int, error) {
	ctx, done := s.core.Op(ctx, "CountStalledByQueue")
	out := map[string]int{}
	if len(queues) == 0 {
		return out, done(nil)
	}
	args := rule.args()
	args["queues"] = queues
	rows, _, err := pgcore.PinnedQuery(ctx, s.core.DB(), s.core.Q(stalledByQueueSQL), args)
	if err != nil {
		return nil, done(err)
	}
	var (
		queue string
		n     int
	)
	_, err = pgx.ForEachRow(rows, []any{&queue, &n}, func() error {
		out[queue] = n
		return nil
	})
	if err != nil {
		return nil, done(err)
	}
	return out, done(nil)
}
