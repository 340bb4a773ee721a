package pgstore_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/jobreaper/jobreaper/internal/pgstore"
	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
)

// pausePoint stops the first reap transaction of a Store between its
// leader lease check and its COMMIT, where a leader paused by the
// operating system (SIGSTOP) or a long GC stop would be, until resume is
// closed.
type pausePoint struct {
	reached, resume chan struct{}
	once, done      sync.Once
}

func pauseBeforeCommit(t *testing.T, store *testStore) *pausePoint {
	t.Helper()
	p := &pausePoint{reached: make(chan struct{}), resume: make(chan struct{})}
	pgstore.SetBeforeReapCommit(store.daemon, func() {
		p.once.Do(func() {
			close(p.reached)
			<-p.resume
		})
	})
	t.Cleanup(p.release)
	return p
}

// wait returns once the reap transaction stands at the pause.
func (p *pausePoint) wait(t *testing.T) {
	t.Helper()
	select {
	case <-p.reached:
	case <-time.After(30 * time.Second):
		t.Fatal("the reap transaction never reached its COMMIT")
	}
}

func (p *pausePoint) release() { p.done.Do(func() { close(p.resume) }) }

type reapOutcome struct {
	res pgstore.ReapBatchResult
	err error
}

type leaseOutcome struct {
	st  pgstore.LeaderLeaseState
	err error
}

// reapInBackground reaps job id, as read now, on store in a goroutine.
func reapInBackground(t *testing.T, store *testStore, id string) <-chan reapOutcome {
	t.Helper()
	ctx := context.Background()
	sn, err := store.Get(ctx, id)
	requireNoErr(t, err)
	out := make(chan reapOutcome, 1)
	go func() {
		res, err := store.ReapBatch(ctx, pgstore.ReapBatchParams{
			Candidates: []pgstore.ReapCandidate{{JobID: id, Generation: sn.Generation, UpdatedAt: sn.UpdatedAt}},
			Reason:     jobs.ReasonStalled, Rule: rule,
		})
		out <- reapOutcome{res, err}
	}()
	return out
}

// acquireInBackground makes one leader lease attempt in a goroutine.
func acquireInBackground(store *testStore, key string, h pgstore.LeaderLeaseHolder, ttl time.Duration) <-chan leaseOutcome {
	out := make(chan leaseOutcome, 1)
	go func() {
		st, err := store.AcquireLeaderLease(context.Background(), pgstore.LeaderLeaseParams{Key: key, Holder: h, TTL: ttl})
		out <- leaseOutcome{st, err}
	}()
	return out
}

// take makes one attempt and fails the test unless h holds the leader
// lease after it.
func take(t *testing.T, store *testStore, key string, h pgstore.LeaderLeaseHolder, ttl time.Duration) pgstore.LeaderLeaseState {
	t.Helper()
	st, err := store.AcquireLeaderLease(context.Background(), pgstore.LeaderLeaseParams{Key: key, Holder: h, TTL: ttl})
	requireNoErr(t, err)
	if !st.Held {
		t.Fatalf("%s did not take the leader lease: %+v", h, st)
	}
	return st
}

// leaseAttemptsWaiting counts the leader lease attempts on db's schema
// that wait on a lock.
func leaseAttemptsWaiting(t *testing.T, db *jobstest.DB) int64 {
	t.Helper()
	return db.Count(t, `SELECT count(*) FROM pg_stat_activity
 WHERE wait_event_type = 'Lock' AND position($1 in query) > 0 AND position('INSERT INTO' in query) > 0`,
		pgx.Identifier{db.Schema}.Sanitize()+".leader_leases")
}

// notYet fails the test if ch already delivered: what it stands for must
// still be waiting.
func notYet[T any](t *testing.T, ch <-chan T, what string) {
	t.Helper()
	select {
	case v := <-ch:
		t.Fatalf("%s returned while it should wait: %+v", what, v)
	default:
	}
}

func insertStalled(t *testing.T, db *jobstest.DB, id string) {
	t.Helper()
	db.Insert(t, jobstest.Job{ID: id, Type: "report.export", Generation: 1, StartedAgo: jobstest.Ago(40 * time.Minute), IdleAgo: 20 * time.Minute})
}

// The reap's leader lease check locks the lease row until COMMIT: a
// takeover of a lease that expired while the reap transaction stood
// between its check and COMMIT waits for that transaction, so the reap
// commits before anyone else holds the lease.
func TestLeaderLeaseTakeoverWaitsForAnOpenReapTransaction(t *testing.T) {
	t.Parallel()
	db, _ := setup(t, nil)
	key := pgstore.LeaderLeaseKey(nil)
	r1, r2 := pgstore.NewLeaderLeaseHolder(time.Now()), pgstore.NewLeaderLeaseHolder(time.Now())
	// The idle bound is kept far above this test's pause: only the row
	// lock is under test here (the bound has its case test below).
	store1 := stores(db, nil, pgstore.WithLeaderLease(key, r1.ID), pgstore.WithLeaderLeaseTTL(time.Minute))
	store2 := stores(db, nil)
	take(t, store1, key, r1, time.Second)
	insertStalled(t, db, "F1")

	p := pauseBeforeCommit(t, store1)
	reaped := reapInBackground(t, store1, "F1")
	p.wait(t)
	jobstest.Eventually(t, "R1's leader lease expires on the database clock", func() bool {
		return db.Count(t, `SELECT count(*) FROM `+db.Table("leader_leases")+` WHERE expires_at <= clock_timestamp()`) == 1
	})
	taken := acquireInBackground(store2, key, r2, time.Hour)
	jobstest.Eventually(t, "R2's takeover waits on the leader lease row", func() bool {
		notYet(t, taken, "R2's takeover")
		return leaseAttemptsWaiting(t, db) == 1
	})
	notYet(t, taken, "R2's takeover")

	p.release()
	out := <-reaped
	requireNoErr(t, out.err)
	if len(out.res.Reaped) != 1 {
		t.Fatalf("R1's reap = %+v, want F1 reaped", out.res)
	}
	tk := <-taken
	requireNoErr(t, tk.err)
	if !tk.st.Held || tk.st.Holder.ID != r2.ID {
		t.Fatalf("R2's takeover after R1's COMMIT = %+v, want R2 holds it", tk.st)
	}
	requireRow(t, db, "F1", jobs.StatusFailed, 1, 0)
}

// The reaped event names the leader lease holder whose check let the reap
// commit (holder_id), and a Store without a leader lease writes none.
func TestReapedEventNamesTheLeaderLeaseHolder(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, _ := setup(t, nil)
	key := pgstore.LeaderLeaseKey(nil)
	r1 := pgstore.NewLeaderLeaseHolder(time.Now())
	leader := stores(db, nil, pgstore.WithLeaderLease(key, r1.ID), pgstore.WithLeaderLeaseTTL(time.Minute))
	take(t, leader, key, r1, time.Minute)
	insertStalled(t, db, "H1")
	insertStalled(t, db, "H2")
	out := <-reapInBackground(t, leader, "H1")
	requireNoErr(t, out.err)
	if len(out.res.Reaped) != 1 || out.res.Reaped[0].Evidence.HolderID != r1.ID {
		t.Fatalf("the leader's reap = %+v, want H1 reaped with holder %s", out.res, r1.ID)
	}
	out = <-reapInBackground(t, stores(db, nil), "H2")
	requireNoErr(t, out.err)
	if len(out.res.Reaped) != 1 || out.res.Reaped[0].Evidence.HolderID != "" {
		t.Fatalf("the lease-less reap = %+v, want H2 reaped without a holder", out.res)
	}
	for id, want := range map[string]string{"H1": r1.ID, "H2": ""} {
		var got *string
		if err := db.Pool.QueryRow(ctx, `SELECT detail->>'holder_id' FROM `+db.Table("job_events")+
			` WHERE job_id = $1 AND kind = 'reaped'`, id).Scan(&got); err != nil {
			t.Fatal(err)
		}
		if (want == "") != (got == nil) || (got != nil && *got != want) {
			t.Fatalf("%s's reaped event holder_id = %v, want %q (absent when empty)", id, got, want)
		}
	}
}

// TestCase_B45_ALeaderPausedBetweenItsLeaseCheckAndCommitWritesNothing:
// R1's reap transaction checks the leader lease, then R1 is paused past
// the lease's TTL. The idle-in-transaction bound the reap transaction set
// (the TTL) makes PostgreSQL end R1's session, so R2's takeover, which
// waited on the lease row, goes through within TTL plus that bound of R1's
// last renewal; R1, resumed, commits nothing.
func TestCase_B45_ALeaderPausedBetweenItsLeaseCheckAndCommitWritesNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, _ := setup(t, nil)
	key := pgstore.LeaderLeaseKey([]string{"reports"})
	const ttl = time.Second
	r1, r2 := pgstore.NewLeaderLeaseHolder(time.Now()), pgstore.NewLeaderLeaseHolder(time.Now())
	store1 := stores(db, nil, pgstore.WithLeaderLease(key, r1.ID), pgstore.WithLeaderLeaseTTL(ttl))
	store2 := stores(db, nil, pgstore.WithLeaderLease(key, r2.ID), pgstore.WithLeaderLeaseTTL(ttl))
	last := take(t, store1, key, r1, ttl)
	insertStalled(t, db, "J45")

	p := pauseBeforeCommit(t, store1)
	reaped := reapInBackground(t, store1, "J45")
	p.wait(t)
	// R2 tries as a follower does, until it leads; R1 stays paused.
	var led pgstore.LeaderLeaseState
	deadline := time.Now().Add(60 * time.Second)
	for !led.Held {
		if time.Now().After(deadline) {
			t.Fatal("R2 never took the leader lease while R1 was paused: the paused transaction blocks every takeover")
		}
		st, err := store2.AcquireLeaderLease(ctx, pgstore.LeaderLeaseParams{Key: key, Holder: r2, TTL: time.Hour})
		if err == nil {
			led = st
		}
		if !led.Held {
			time.Sleep(50 * time.Millisecond)
		}
	}
	// Within TTL + bound of R1's last renewal, on the database clock; the
	// extra 2 s are room for a slow machine between the renewal and the
	// check, and for R2's polling.
	if took, bound := led.DBNow.Sub(last.RenewedAt), 2*ttl+2*time.Second; took > bound {
		t.Fatalf("R2 led %s after R1's last renewal, want within %s", took, bound)
	}

	p.release()
	out := <-reaped
	if out.err == nil {
		t.Fatalf("R1, paused past its TTL after its check, committed a reap after R2 held the lease: %+v", out.res)
	}
	t.Logf("R1's reap after the pause: %v", out.err)
	requireIs(t, out.err, pgstore.ErrLeaderLeaseLost)
	if len(out.res.Reaped) != 0 {
		t.Fatalf("R1's failed reap reports reaped jobs: %+v", out.res)
	}
	requireRow(t, db, "J45", jobs.StatusProcessing, 1, 0)
	requireCount(t, db, 0, `SELECT count(*) FROM `+db.Table("job_events")+` WHERE job_id = 'J45'`)

	// The new leader reaps it.
	res, err := store2.ReapBatch(ctx, pgstore.ReapBatchParams{
		Candidates: []pgstore.ReapCandidate{{JobID: "J45", Generation: 1, UpdatedAt: db.Read(t, "J45").UpdatedAt}},
		Reason:     jobs.ReasonStalled, Rule: rule,
	})
	requireNoErr(t, err)
	if len(res.Reaped) != 1 {
		t.Fatalf("R2's reap = %+v", res)
	}
	requireRow(t, db, "J45", jobs.StatusFailed, 1, 0)
}

// The leader's own renewals (another connection, the same holder) wait
// for its reap transactions only from their leader lease check to their
// COMMIT: not while a reap waits on a job's row lock, and just until the
// COMMIT once it has checked.
func TestLeaderRenewalsWaitOnlyFromTheReapsCheckToItsCommit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, _ := setup(t, nil)
	key := pgstore.LeaderLeaseKey(nil)
	r1 := pgstore.NewLeaderLeaseHolder(time.Now())
	store := stores(db, nil, pgstore.WithLeaderLease(key, r1.ID), pgstore.WithLeaderLeaseTTL(time.Minute))
	renewals := stores(db, nil)
	take(t, store, key, r1, time.Minute)
	insertStalled(t, db, "R1")

	lockTx, err := db.Pool.Begin(ctx)
	requireNoErr(t, err)
	defer func() { _ = lockTx.Rollback(ctx) }()
	_, err = lockTx.Exec(ctx, `SELECT 1 FROM `+db.Table("jobs")+` WHERE id = 'R1' FOR UPDATE`)
	requireNoErr(t, err)
	p := pauseBeforeCommit(t, store)
	reaped := reapInBackground(t, store, "R1")
	jobstest.Eventually(t, "the reap waits on R1's row lock", func() bool {
		return db.Count(t, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND position('FOR UPDATE' in query) > 0 AND position($1 in query) > 0`,
			pgx.Identifier{db.Schema}.Sanitize()+".jobs") == 1
	})
	// Before the check: a renewal does not wait.
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	st, err := renewals.AcquireLeaderLease(rctx, pgstore.LeaderLeaseParams{Key: key, Holder: r1, TTL: time.Minute})
	cancel()
	if err != nil || !st.Held {
		t.Fatalf("a renewal while the reap waits on a row lock = %+v, %v; want held at once", st, err)
	}

	// Between the check and COMMIT: a renewal waits, then goes through.
	requireNoErr(t, lockTx.Rollback(ctx))
	p.wait(t)
	renewed := acquireInBackground(renewals, key, r1, time.Minute)
	jobstest.Eventually(t, "the renewal waits for the reap's COMMIT", func() bool {
		notYet(t, renewed, "the renewal")
		return leaseAttemptsWaiting(t, db) == 1
	})
	p.release()
	out := <-reaped
	requireNoErr(t, out.err)
	if len(out.res.Reaped) != 1 {
		t.Fatalf("the reap = %+v, want R1 reaped", out.res)
	}
	if rn := <-renewed; rn.err != nil || !rn.st.Held {
		t.Fatalf("the renewal after the COMMIT = %+v, %v; want held", rn.st, rn.err)
	}
}
