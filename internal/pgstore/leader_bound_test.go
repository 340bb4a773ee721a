package pgstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/jobreaper/jobreaper/internal/pgstore"
	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
)

// The idle bound is the leader lease's TTL, or the server's own setting
// when that is shorter and not off.
func TestLeaderIdleBoundKeepsAShorterServerSetting(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, _ := setup(t, nil)
	for _, c := range []struct {
		server string
		ttlMS  int64
		want   string
	}{
		{"0", 1000, "1s"},
		{"300ms", 1000, "300ms"},
		{"5s", 1500, "1500ms"},
		{"1min", 90000, "1min"},
	} {
		requireNoErr(t, inTx(t, db, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `SELECT set_config('idle_in_transaction_session_timeout', $1, true)`, c.server); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, pgstore.LeaderIdleBoundSQL, c.ttlMS); err != nil {
				return err
			}
			var got string
			if err := tx.QueryRow(ctx, `SHOW idle_in_transaction_session_timeout`).Scan(&got); err != nil {
				return err
			}
			if got != c.want {
				t.Errorf("server %s, TTL %d ms: the bound is %s, want %s", c.server, c.ttlMS, got, c.want)
			}
			return nil
		}))
	}
}

// Behind PgBouncer in transaction mode the fence works the same: the
// bound is local to the reap transaction (the pooled server connection
// keeps the server's setting for the next client), and a leader paused
// past it commits nothing while the other replica takes over.
func TestPooledReapFencedByTheLeaderLease(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	// One server connection, so the next transaction runs on the one the
	// reap used.
	s := jobstest.NewPooled(t, jobstest.PgBouncerOptions{PoolSize: 1})
	_, err := s.Direct.Exec(ctx, `
INSERT INTO jobreaper.job_types (name, max_runtime) VALUES ('report.export', '30 minutes');
INSERT INTO jobreaper.jobs (id, type, status, generation, started_at, updated_at)
SELECT id, 'report.export', 'PROCESSING', 1, now() - interval '40 minutes', now() - interval '20 minutes'
  FROM unnest(ARRAY['P1', 'P2']) id`)
	requireNoErr(t, err)
	pool := s.Connect(t, 2)
	key := pgstore.LeaderLeaseKey(nil)
	const ttl = time.Second
	r1, r2 := pgstore.NewLeaderLeaseHolder(time.Now()), pgstore.NewLeaderLeaseHolder(time.Now())
	store1 := &testStore{daemon: pgstore.New(pool, pgstore.WithSchema(jobstest.PooledSchema), pgstore.WithLeaderLease(key, r1.ID), pgstore.WithLeaderLeaseTTL(ttl))}
	store2 := &testStore{daemon: pgstore.New(s.Direct, pgstore.WithSchema(jobstest.PooledSchema), pgstore.WithLeaderLease(key, r2.ID), pgstore.WithLeaderLeaseTTL(ttl))}
	reapOne := func(store *testStore, id string) (pgstore.ReapBatchResult, error) {
		sn, err := store.Get(ctx, id)
		requireNoErr(t, err)
		return store.ReapBatch(ctx, pgstore.ReapBatchParams{Reason: jobs.ReasonStalled, Rule: rule,
			Candidates: []pgstore.ReapCandidate{{JobID: id, Generation: sn.Generation, UpdatedAt: sn.UpdatedAt}}})
	}
	serverSetting := func(db jobs.DB) string {
		t.Helper()
		var v string
		requireNoErr(t, db.QueryRow(ctx, `SHOW idle_in_transaction_session_timeout`).Scan(&v))
		return v
	}

	take(t, store1, key, r1, time.Minute)
	res, err := reapOne(store1, "P1")
	requireNoErr(t, err)
	if len(res.Reaped) != 1 {
		t.Fatalf("pooled reap with the leader lease = %+v", res)
	}
	if got, want := serverSetting(pool), serverSetting(s.Direct); got != want {
		t.Fatalf("idle_in_transaction_session_timeout after a pooled reap = %s, want the server's %s: the bound outlived its transaction", got, want)
	}

	// Paused between the check and COMMIT, past the TTL.
	last := take(t, store1, key, r1, ttl)
	p := pauseBeforeCommit(t, store1)
	sn, err := store1.Get(ctx, "P2")
	requireNoErr(t, err)
	reaped := make(chan reapOutcome, 1)
	go func() {
		res, err := store1.ReapBatch(ctx, pgstore.ReapBatchParams{Reason: jobs.ReasonStalled, Rule: rule,
			Candidates: []pgstore.ReapCandidate{{JobID: "P2", Generation: sn.Generation, UpdatedAt: sn.UpdatedAt}}})
		reaped <- reapOutcome{res, err}
	}()
	p.wait(t)
	var led pgstore.LeaderLeaseState
	deadline := time.Now().Add(60 * time.Second)
	for !led.Held {
		if time.Now().After(deadline) {
			t.Fatal("R2 never took the leader lease while R1 was paused behind the pooler")
		}
		if st, err := store2.AcquireLeaderLease(ctx, pgstore.LeaderLeaseParams{Key: key, Holder: r2, TTL: time.Hour}); err == nil {
			led = st
		}
		if !led.Held {
			time.Sleep(50 * time.Millisecond)
		}
	}
	if took, bound := led.DBNow.Sub(last.RenewedAt), 2*ttl+2*time.Second; took > bound {
		t.Fatalf("R2 led %s after R1's last renewal, want within %s", took, bound)
	}
	p.release()
	out := <-reaped
	if out.err == nil {
		t.Fatalf("R1, paused behind the pooler past its TTL, committed: %+v", out.res)
	}
	t.Logf("R1's pooled reap after the pause: %v", out.err)
	if n := s.Count(t, `SELECT count(*) FROM jobreaper.jobs WHERE id = 'P2' AND status = 'PROCESSING'`); n != 1 {
		t.Fatal("P2 is not PROCESSING after R1's paused reap")
	}
	if n := s.Count(t, `SELECT count(*) FROM jobreaper.job_events WHERE job_id = 'P2'`); n != 0 {
		t.Fatalf("P2 has %d events after R1's paused reap, want 0", n)
	}
	// The pooler serves the next transaction on a fresh server connection.
	if got, want := serverSetting(pool), serverSetting(s.Direct); got != want {
		t.Fatalf("idle_in_transaction_session_timeout through the pooler = %s, want %s", got, want)
	}
	s.RequirePublicUntouched(t)
}
