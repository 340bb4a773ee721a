package pgstore_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/jobreaper/jobreaper/internal/pgstore"
	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
)

func TestLeaderLeaseKey(t *testing.T) {
	t.Parallel()
	if a, b := pgstore.LeaderLeaseKey([]string{"b", "a", "b"}), pgstore.LeaderLeaseKey([]string{"a", "b"}); a != b || a != `["a","b"]` {
		t.Fatalf("keys %q and %q, want both [\"a\",\"b\"]", a, b)
	}
	if k := pgstore.LeaderLeaseKey(nil); k != "[]" {
		t.Fatalf("every queue = %q, want []", k)
	}
}

func TestAcquireLeaderLease(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, store := setup(t, nil)
	a, b := pgstore.NewLeaderLeaseHolder(time.Now()), pgstore.NewLeaderLeaseHolder(time.Now())
	key := pgstore.LeaderLeaseKey([]string{"q1"})
	try := func(h pgstore.LeaderLeaseHolder, ttl time.Duration, settings string) pgstore.LeaderLeaseState {
		t.Helper()
		st, err := store.AcquireLeaderLease(ctx, pgstore.LeaderLeaseParams{Key: key, Holder: h, TTL: ttl, Settings: json.RawMessage(settings)})
		requireNoErr(t, err)
		return st
	}

	st := try(a, time.Hour, `{"interval":"1m0s"}`)
	if !st.Held || st.Holder.ID != a.ID || !st.ExpiresAt.After(st.DBNow) {
		t.Fatalf("first attempt = %+v, want a holds it", st)
	}
	// b is refused while a's is valid, and sees a's settings.
	st = try(b, time.Hour, `{"interval":"2m0s"}`)
	if st.Held || st.Holder.ID != a.ID || string(st.Settings) != `{"interval": "1m0s"}` {
		t.Fatalf("b's attempt = %+v settings %s, want a's leader lease and settings", st, st.Settings)
	}
	// a renews, keeping its acquisition time.
	first := st.AcquiredAt
	st = try(a, time.Hour, `{"interval":"1m0s"}`)
	if !st.Held || !st.AcquiredAt.Equal(first) || !st.RenewedAt.After(first) {
		t.Fatalf("renewal = %+v", st)
	}
	// Once a's leader lease expires, b takes it.
	try(a, time.Second, `{}`)
	jobstest.Eventually(t, "b takes the expired leader lease", func() bool {
		return try(b, time.Hour, `{}`).Held
	})
	if st := try(a, time.Hour, `{}`); st.Held || st.Holder.ID != b.ID {
		t.Fatalf("a after b took over = %+v", st)
	}
	// A release by a non-holder changes nothing; b's release frees it.
	requireNoErr(t, store.ReleaseLeaderLease(ctx, key, a.ID))
	if st := try(a, time.Hour, `{}`); st.Held {
		t.Fatalf("a took b's leader lease after its own release: %+v", st)
	}
	requireNoErr(t, store.ReleaseLeaderLease(ctx, key, b.ID))
	if st := try(a, time.Hour, `{}`); !st.Held {
		t.Fatalf("a could not take the released leader lease: %+v", st)
	}
	// Another queue set has its own leader lease.
	other, err := store.AcquireLeaderLease(ctx, pgstore.LeaderLeaseParams{Key: pgstore.LeaderLeaseKey([]string{"q2"}), Holder: b, TTL: time.Hour})
	requireNoErr(t, err)
	if !other.Held {
		t.Fatalf("b could not lead another queue set: %+v", other)
	}
}

// A reap transaction that waits on a row lock until its leader lease has
// expired rolls back at its last statement: nothing is written.
func TestReapRollsBackWhenTheLeaderLeaseLapsedWhileItWaited(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, _ := setup(t, nil)
	holder := pgstore.NewLeaderLeaseHolder(time.Now())
	key := pgstore.LeaderLeaseKey(nil)
	store := stores(db, nil, pgstore.WithLeaderLease(key, holder.ID))
	st, err := store.AcquireLeaderLease(ctx, pgstore.LeaderLeaseParams{Key: key, Holder: holder, TTL: 2 * time.Second})
	requireNoErr(t, err)
	if !st.Held {
		t.Fatalf("leader lease not taken: %+v", st)
	}
	db.Insert(t, jobstest.Job{ID: "L1", Type: "report.export", Generation: 1, StartedAgo: jobstest.Ago(40 * time.Minute), IdleAgo: 20 * time.Minute})
	sn, err := store.Get(ctx, "L1")
	requireNoErr(t, err)

	// Another transaction holds L1's row lock.
	lockTx, err := db.Pool.Begin(ctx)
	requireNoErr(t, err)
	defer func() { _ = lockTx.Rollback(ctx) }()
	_, err = lockTx.Exec(ctx, `SELECT 1 FROM `+db.Table("jobs")+` WHERE id = 'L1' FOR UPDATE`)
	requireNoErr(t, err)
	type outcome struct {
		res pgstore.ReapBatchResult
		err error
	}
	done := make(chan outcome, 1)
	go func() {
		res, err := store.ReapBatch(ctx, pgstore.ReapBatchParams{
			Candidates: []pgstore.ReapCandidate{{JobID: "L1", Generation: sn.Generation, UpdatedAt: sn.UpdatedAt}},
			Reason:     jobs.ReasonStalled, Rule: rule,
		})
		done <- outcome{res, err}
	}()
	jobstest.Eventually(t, "the reap waits on the row lock", func() bool {
		return db.Count(t, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND position($1 in query) > 0`, db.Schema) > 0
	})
	jobstest.Eventually(t, "the leader lease expires on the database clock", func() bool {
		return db.Count(t, `SELECT count(*) FROM `+db.Table("leader_leases")+` WHERE expires_at <= clock_timestamp()`) == 1
	})
	requireNoErr(t, lockTx.Rollback(ctx))
	out := <-done
	requireIs(t, out.err, pgstore.ErrLeaderLeaseLost)
	requireRow(t, db, "L1", jobs.StatusProcessing, 1, 0)
	requireCount(t, db, 0, `SELECT count(*) FROM `+db.Table("job_events")+` WHERE job_id = 'L1'`)

	// Renewed, the same reap goes through.
	st, err = store.AcquireLeaderLease(ctx, pgstore.LeaderLeaseParams{Key: key, Holder: holder, TTL: time.Hour})
	requireNoErr(t, err)
	if !st.Held {
		t.Fatalf("renewal = %+v", st)
	}
	res, err := store.ReapBatch(ctx, pgstore.ReapBatchParams{
		Candidates: []pgstore.ReapCandidate{{JobID: "L1", Generation: sn.Generation, UpdatedAt: sn.UpdatedAt}},
		Reason:     jobs.ReasonStalled, Rule: rule,
	})
	requireNoErr(t, err)
	if len(res.Reaped) != 1 {
		t.Fatalf("reap with a valid leader lease = %+v", res)
	}
}
