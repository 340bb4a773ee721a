package pgstore

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/jobreaper/jobreaper/internal/broken"
	"github.com/jobreaper/jobreaper/internal/pgcore"
)

// ErrLeaderLeaseLost: a reap transaction's last check found that this
// daemon no longer holds a valid leader lease (it expired while the daemon
// was paused or waited on a lock, or another replica took it), or the
// transaction sat idle past the leader lease's TTL and PostgreSQL ended its
// session (WithLeaderLeaseTTL); either way the transaction was rolled back
// and nothing of it was written.
var ErrLeaderLeaseLost = errors.New("leader lease lost: the reap transaction was rolled back")

// LeaderLeaseHolder identifies one daemon process holding, or trying to
// take, a leader lease.
type LeaderLeaseHolder struct {
	// ID is unique per process (NewLeaderLeaseHolder draws it at random);
	// the leader lease is held by ID, the rest is for people.
	ID        string    `json:"id"`
	Host      string    `json:"host"`
	PID       int       `json:"pid"`
	StartedAt time.Time `json:"started_at"`
}

// NewLeaderLeaseHolder returns this process's identity: a random ID, the
// host name, the process ID and startedAt (the daemon's start).
func NewLeaderLeaseHolder(startedAt time.Time) LeaderLeaseHolder {
	var b [8]byte
	_, _ = rand.Read(b[:]) // crypto/rand never fails on supported platforms
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown"
	}
	return LeaderLeaseHolder{ID: hex.EncodeToString(b[:]), Host: host, PID: os.Getpid(), StartedAt: startedAt}
}

// String names the holder for logs: host:pid (started ...).
func (h LeaderLeaseHolder) String() string {
	return fmt.Sprintf("%s:%d (started %s, id %s)", h.Host, h.PID, h.StartedAt.UTC().Format(time.RFC3339), h.ID)
}

// LeaderLeaseKey returns the leader lease key of a daemon scanning queues:
// the names sorted and without duplicates, as a JSON array; "[]" when
// queues is empty (every queue). Daemons configured with the same set, in
// any order, share one leader lease; pools configured for different sets
// each elect their own leader, so each set is scanned (a queue that no
// set names is not; the first leader reports such queues).
func LeaderLeaseKey(queues []string) string {
	set := slices.Clone(queues)
	slices.Sort(set)
	set = slices.Compact(set)
	if set == nil {
		set = []string{}
	}
	b, _ := json.Marshal(set) // a []string always marshals
	return string(b)
}

// LeaderLeaseParams are one attempt to take or renew a leader lease.
type LeaderLeaseParams struct {
	Key    string
	Holder LeaderLeaseHolder
	// TTL is how long the leader lease stays valid from this attempt, on
	// the database clock.
	TTL time.Duration
	// Settings are the settings that decide a reap, as this daemon runs
	// them: stored in the row when this daemon holds the leader lease, for
	// the other replicas to compare with theirs. A JSON object.
	Settings json.RawMessage
}

// LeaderLeaseState is a leader lease row as one attempt left it.
type LeaderLeaseState struct {
	// Held: the attempt's holder holds the leader lease until ExpiresAt.
	Held bool
	// Found is false when no row exists for the key (another replica's
	// first insert raced this attempt); the other fields are then zero.
	Found bool
	// Holder is the row's holder (this daemon when Held).
	Holder LeaderLeaseHolder
	// Settings are the holder's recorded settings.
	Settings json.RawMessage
	// AcquiredAt, RenewedAt and ExpiresAt are the row's; DBNow is the
	// database's clock_timestamp() of the attempt.
	AcquiredAt, RenewedAt, ExpiresAt, DBNow time.Time
}

// Age is how long ago, on the database clock, the leader lease was last
// renewed (0 when no row was found).
func (st LeaderLeaseState) Age() time.Duration {
	if !st.Found {
		return 0
	}
	return st.DBNow.Sub(st.RenewedAt)
}

// acquireLeaderLeaseSQL takes the row when it is missing or expired, or
// renews it when the holder already holds it (even just expired, as long
// as nobody took it meanwhile), all on clock_timestamp(); otherwise it
// returns the row as it is. Every time is the database's.
const acquireLeaderLeaseSQL = `
WITH up AS (
    INSERT INTO {schema}.leader_leases AS l
           (key, holder_id, holder_host, holder_pid, holder_started_at, acquired_at, renewed_at, expires_at, settings)
    VALUES (@key, @id, @host, @pid, @started_at, clock_timestamp(), clock_timestamp(), clock_timestamp() + @ttl, @settings::jsonb)
    ON CONFLICT (key) DO UPDATE
       SET holder_id = excluded.holder_id, holder_host = excluded.holder_host, holder_pid = excluded.holder_pid,
           holder_started_at = excluded.holder_started_at,
           acquired_at = CASE WHEN l.holder_id = excluded.holder_id THEN l.acquired_at ELSE excluded.acquired_at END,
           renewed_at = excluded.renewed_at, expires_at = excluded.expires_at, settings = excluded.settings
     WHERE l.holder_id = excluded.holder_id OR l.expires_at <= clock_timestamp()
    RETURNING l.holder_id, l.holder_host, l.holder_pid, l.holder_started_at, l.settings, l.acquired_at, l.renewed_at, l.expires_at)
SELECT true, holder_id, holder_host, holder_pid, holder_started_at, settings::text, acquired_at, renewed_at, expires_at, clock_timestamp()
  FROM up
UNION ALL
SELECT false, holder_id, holder_host, holder_pid, holder_started_at, settings::text, acquired_at, renewed_at, expires_at, clock_timestamp()
  FROM {schema}.leader_leases
 WHERE key = @key AND NOT EXISTS (SELECT 1 FROM up)`

// AcquireLeaderLease takes the leader lease p.Key for p.Holder when nobody
// holds a valid one, renews it when p.Holder holds it, and otherwise
// leaves it to its holder; in every case it returns the row as the attempt
// left it (its holder's settings, for the settings drift check). One
// statement, on the database clock (clock_timestamp()).
//
// Errors: pgcore.ErrInvalidArgument for an empty key or holder ID, a TTL under
// one second or settings that are not a JSON object (nothing sent); a
// wrapped driver error or the operation's timeout otherwise (the leader
// lease then stays as it was: a holder that cannot renew loses it at
// expiry).
func (s *Store) AcquireLeaderLease(ctx context.Context, p LeaderLeaseParams) (LeaderLeaseState, error) {
	ctx, done := s.core.Op(ctx, "AcquireLeaderLease")
	var st LeaderLeaseState
	switch {
	case p.Key == "" || p.Holder.ID == "":
		return st, done(fmt.Errorf("a leader lease needs a key and a holder ID: %w", pgcore.ErrInvalidArgument))
	case p.TTL < time.Second:
		return st, done(fmt.Errorf("leader lease TTL %s is under 1s: %w", p.TTL, pgcore.ErrInvalidArgument))
	}
	settings := p.Settings
	if settings == nil {
		settings = json.RawMessage(`{}`)
	}
	var probe map[string]any
	if err := json.Unmarshal(settings, &probe); err != nil {
		return st, done(fmt.Errorf("leader lease settings are not a JSON object: %w", pgcore.ErrInvalidArgument))
	}
	var text string
	err := s.core.DB().QueryRow(ctx, s.core.Q(acquireLeaderLeaseSQL), pgx.NamedArgs{
		"key": p.Key, "id": p.Holder.ID, "host": p.Holder.Host, "pid": p.Holder.PID,
		"started_at": p.Holder.StartedAt, "ttl": pgcore.Interval(p.TTL), "settings": string(settings),
	}).Scan(&st.Held, &st.Holder.ID, &st.Holder.Host, &st.Holder.PID, &st.Holder.StartedAt, &text,
		&st.AcquiredAt, &st.RenewedAt, &st.ExpiresAt, &st.DBNow)
	if errors.Is(err, pgx.ErrNoRows) {
		return LeaderLeaseState{}, done(nil)
	}
	if err != nil {
		return LeaderLeaseState{}, done(err)
	}
	st.Found, st.Settings = true, json.RawMessage(text)
	return st, done(nil)
}

// ReleaseLeaderLease gives up the leader lease key if holderID holds it,
// so another replica takes over at its next attempt instead of waiting for
// the expiry (a clean exit). It changes nothing when another replica holds
// it. It returns a wrapped driver error or the operation's timeout.
func (s *Store) ReleaseLeaderLease(ctx context.Context, key, holderID string) error {
	ctx, done := s.core.Op(ctx, "ReleaseLeaderLease")
	_, err := s.core.DB().Exec(ctx, s.core.Q(`DELETE FROM {schema}.leader_leases WHERE key = $1 AND holder_id = $2`), key, holderID)
	return done(err)
}

// leaderFence is the leader lease a Store's reap transactions check.
type leaderFence struct {
	key, holderID string
}

// WithLeaderLease makes every reap transaction of the Store (ReapBatch)
// check, as its last statement before COMMIT and on clock_timestamp(),
// that holderID still holds a valid leader lease key, and roll back with
// ErrLeaderLeaseLost otherwise: a leader paused or blocked on a row lock
// while its leader lease lapsed changes nothing. clock_timestamp(), not
// now(): now() is the transaction's start, before any lock wait.
//
// The check reads the leader lease row FOR SHARE, so it also fences the
// COMMIT: a takeover (or a renewal, or a release) of that row waits until
// the reap transaction ends, and no other replica holds the leader lease
// while a reap that passed its check is still to commit. FOR KEY SHARE
// would not do: the takeover's INSERT ... ON CONFLICT DO UPDATE does not
// wait for it. So that a leader paused while it holds that lock cannot
// hold every takeover back, each reap transaction bounds how long it may
// sit idle (idle_in_transaction_session_timeout, SET LOCAL) by the leader
// lease's TTL: see WithLeaderLeaseTTL.
//
// The daemon sets it when it runs with a leader lease; run --once and dry
// runs do not.
func WithLeaderLease(key, holderID string) Option {
	return func(o *options) { o.leader = &leaderFence{key: key, holderID: holderID} }
}

// WithLeaderLeaseTTL gives the Store the TTL of the leader lease that
// WithLeaderLease names (the TTL its AcquireLeaderLease calls pass). Each
// reap transaction then sets idle_in_transaction_session_timeout, for
// itself only (SET LOCAL), to ttl, or to the server's own setting when
// that is shorter: a leader paused between its leader lease check and
// COMMIT (SIGSTOP, a long GC stop) has its session ended by PostgreSQL
// after that long, its COMMIT fails and nothing of the reap is written,
// and the takeover its lock held back goes through, within TTL plus ttl
// of the leader's last renewal. Without this option the bound is one
// second, the shortest TTL AcquireLeaderLease accepts. A ttl of 0 or less
// is ignored. The setting travels in the pipeline of the transaction's
// first statements (no round trip of its own) and, being local to the
// transaction, works behind a transaction-mode pooler and never outlives
// the transaction on a pooled server connection.
func WithLeaderLeaseTTL(ttl time.Duration) Option {
	return func(o *options) {
		if ttl > 0 {
			o.leaderTTL = ttl
		}
	}
}

// leaderIdleBoundDefault is the idle bound of a reap transaction when the
// Store was not given the leader lease's TTL: the shortest TTL
// AcquireLeaderLease accepts, so at most any leader lease's TTL.
const leaderIdleBoundDefault = time.Second

// leaderIdleBoundSQL sets idle_in_transaction_session_timeout for the
// rest of the transaction (set_config's third argument: SET LOCAL, which
// takes no parameter) to $1 milliseconds, or to the server's setting when
// that is shorter and not off (0). LEAST ignores the NULL of an unset one.
const leaderIdleBoundSQL = `
SELECT set_config('idle_in_transaction_session_timeout',
       least($1::int8, nullif(extract(epoch FROM current_setting('idle_in_transaction_session_timeout')::interval) * 1000, 0)::int8)::text,
       true)`

// leaderIdleBound returns the statement that bounds a reap transaction's
// idle time, for the pipeline of its first statements; nothing without a
// leader lease.
func (s *Store) leaderIdleBound() []pgcore.Before {
	if s.leader == nil || broken.Fence {
		return nil
	}
	bound := cmp.Or(s.leaderTTL, leaderIdleBoundDefault)
	ms := (bound + time.Millisecond - 1) / time.Millisecond // 0 would turn the bound off
	return []pgcore.Before{{SQL: leaderIdleBoundSQL, Args: []any{int64(ms)}}}
}

// checkLeaderLeaseSQL is the reap transaction's leader lease check. FOR
// SHARE keeps the row locked until the transaction ends (see
// WithLeaderLease); a row that a concurrent takeover is changing is read,
// once it committed, as it then is (PostgreSQL re-checks the WHERE on the
// new row version), so a lost leader lease reads false.
const checkLeaderLeaseSQL = `
SELECT EXISTS (SELECT 1 FROM {schema}.leader_leases
                WHERE key = $1 AND holder_id = $2 AND expires_at > clock_timestamp()
                  FOR SHARE)`

// checkLeaderLease is the reap transaction's last statement before COMMIT
// when the Store has a leader lease (WithLeaderLease); without one it
// sends nothing. It returns ErrLeaderLeaseLost when the leader lease is
// not this daemon's or has expired.
func (s *Store) checkLeaderLease(ctx context.Context, tx pgx.Tx) error {
	if s.leader == nil || broken.Fence {
		return nil
	}
	var held bool
	if err := tx.QueryRow(ctx, s.core.Q(checkLeaderLeaseSQL), s.leader.key, s.leader.holderID).Scan(&held); err != nil {
		return fmt.Errorf("checking the leader lease before COMMIT: %w", err)
	}
	if !held {
		return fmt.Errorf("leader lease %s is no longer held by %s at COMMIT: %w", s.leader.key, s.leader.holderID, ErrLeaderLeaseLost)
	}
	return nil
}

// LeaderCascadeDigests returns the distinct cascade digests
// (reaper.CascadesDigest) that the holders of unexpired leader leases
// recorded in their settings, so that an operator command run with other
// cascades can say the daemon's would not run. Empty when no lease is held
// or none recorded one. Errors: a wrapped driver error or the operation's
// timeout.
func (s *Store) LeaderCascadeDigests(ctx context.Context) ([]string, error) {
	ctx, done := s.core.Op(ctx, "LeaderCascadeDigests")
	rows, err := s.core.DB().Query(ctx, s.core.Q(`
SELECT DISTINCT settings->>'cascades' FROM {schema}.leader_leases
 WHERE expires_at > clock_timestamp() AND settings->>'cascades' IS NOT NULL
 ORDER BY 1`))
	if err != nil {
		return nil, done(err)
	}
	digests, err := pgx.CollectRows(rows, pgx.RowTo[string])
	return digests, done(err)
}
