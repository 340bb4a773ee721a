package jobs_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
)

// cutHeartbeater returns, over a fresh schema with one claimed job j1, a
// Heartbeater on a fake clock with interval whose Store reaches
// PostgreSQL through a pool the test can cut, and that pool. Heartbeat
// writes are counted in the database (countWrites).
func cutHeartbeater(t *testing.T, interval time.Duration, opts ...jobs.StoreOption) (*jobstest.DB, *jobstest.Cuttable, *jobs.Heartbeater, *clockwork.FakeClock, jobs.Lease) {
	t.Helper()
	db, store := setup(t, nil)
	countWrites(t, db)
	lease := queued(t, db, store, jobstest.Job{ID: "j1", Type: "crawl.site"}, "w1")
	cut := db.Cuttable(t)
	clock := clockwork.NewFakeClockAt(epoch)
	hb, err := jobs.NewHeartbeater(jobs.NewStore(cut.Pool, append([]jobs.StoreOption{jobs.WithSchema(db.Schema)}, opts...)...), clock, interval)
	requireNoErr(t, err)
	return db, cut, hb, clock, lease
}

// beater calls Heartbeat for lease with a mark that grows at every call.
type beater struct {
	hb    *jobs.Heartbeater
	lease jobs.Lease
	mu    sync.Mutex
	mark  int64
}

func (b *beater) beat() (jobs.HeartbeatResult, error) {
	b.mu.Lock()
	b.mark++
	mark := b.mark
	b.mu.Unlock()
	return b.hb.Heartbeat(context.Background(), b.lease, mark)
}

// outageSteps walks the limiter through a cut connection: at each step
// the first call is sent and fails, every further call within the step's
// backoff is throttled (one millisecond before its end too), and the clock
// then moves to the step's end. It leaves the clock where the next call
// is let through again.
func outageSteps(t *testing.T, b *beater, clock *clockwork.FakeClock, backoffs []time.Duration) {
	t.Helper()
	for i, backoff := range backoffs {
		res, err := b.beat()
		if err == nil || !res.Sent || res.Written || errors.Is(err, jobs.ErrStaleWorker) || errors.Is(err, jobs.ErrJobTerminal) {
			t.Fatalf("step %d: first call while cut = %+v, %v; want sent and failed with a driver error", i, res, err)
		}
		for range 10 {
			if res, err := b.beat(); err != nil || !res.Throttled || res.Sent {
				t.Fatalf("step %d: call within the %s backoff = %+v, %v; want throttled", i, backoff, res, err)
			}
		}
		clock.Advance(backoff - time.Millisecond)
		if res, err := b.beat(); err != nil || !res.Throttled {
			t.Fatalf("step %d: call 1ms before the %s backoff ends = %+v, %v; want throttled", i, backoff, res, err)
		}
		clock.Advance(time.Millisecond)
	}
}

func TestHeartbeatAfterAFailedWrite(t *testing.T) {
	t.Parallel()

	t.Run("IsRetriedAfterADoublingBackoffAndTheFirstCallAfterTheOutageWrites", func(t *testing.T) {
		t.Parallel()
		db, cut, hb, clock, lease := cutHeartbeater(t, 0)
		b := &beater{hb: hb, lease: lease}
		if res, err := b.beat(); err != nil || !res.Written {
			t.Fatalf("heartbeat before the outage = %+v, %v; want written", res, err)
		}
		clock.Advance(jobs.HeartbeatIntervalDefault)
		cut.Cut()
		// 5-minute interval: the backoff starts at 1 s and doubles.
		outageSteps(t, b, clock, []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 16 * time.Second})
		cut.Restore()
		res, err := b.beat()
		if err != nil || !res.Written {
			t.Fatalf("first call once the outage ended and the backoff elapsed = %+v, %v; want written", res, err)
		}
		// The write went through: the interval bound holds again.
		clock.Advance(jobs.HeartbeatIntervalDefault - time.Millisecond)
		if res, err := b.beat(); err != nil || !res.Throttled {
			t.Fatalf("call within the interval after the written heartbeat = %+v, %v; want throttled", res, err)
		}
		clock.Advance(time.Millisecond)
		if res, err := b.beat(); err != nil || !res.Written {
			t.Fatalf("call one interval after the written heartbeat = %+v, %v; want written", res, err)
		}
		if n := writes(t, db, "j1"); n != 3 {
			t.Fatalf("heartbeat UPDATEs = %d, want 3 (before, right after and one interval after the outage)", n)
		}
		if st := hb.Stats(); st.Sent != 8 || st.Failed != 5 || st.Written != 3 || st.Refused != 0 {
			t.Fatalf("stats = %+v, want 8 sent, 5 failed, 3 written", st)
		}
		if cut.Refused() < 5 {
			t.Fatalf("the pool refused %d connections, want one per failed write at least", cut.Refused())
		}
	})

	t.Run("BackoffStartsAtTheLesserOfOneSecondAndAFifthOfTheIntervalAndNeverPassesThatFifth", func(t *testing.T) {
		t.Parallel()
		for _, c := range []struct {
			interval time.Duration
			backoffs []time.Duration
		}{
			{10 * time.Second, []time.Duration{time.Second, 2 * time.Second, 2 * time.Second, 2 * time.Second}},
			{time.Second, []time.Duration{200 * time.Millisecond, 200 * time.Millisecond, 200 * time.Millisecond}},
			{jobs.HeartbeatIntervalDefault, []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second,
				16 * time.Second, 32 * time.Second, time.Minute, time.Minute}},
		} {
			db, cut, hb, clock, lease := cutHeartbeater(t, c.interval)
			b := &beater{hb: hb, lease: lease}
			cut.Cut()
			outageSteps(t, b, clock, c.backoffs)
			cut.Restore()
			if res, err := b.beat(); err != nil || !res.Written {
				t.Fatalf("interval %s: call after the outage = %+v, %v; want written", c.interval, res, err)
			}
			if n := writes(t, db, "j1"); n != 1 {
				t.Fatalf("interval %s: heartbeat UPDATEs = %d, want 1", c.interval, n)
			}
		}
	})

	t.Run("ConcurrentCallsDuringAnOutageSendOneWritePerBackoffStep", func(t *testing.T) {
		t.Parallel()
		db, cut, hb, clock, lease := cutHeartbeater(t, 10*time.Second)
		b := &beater{hb: hb, lease: lease}
		burst := func() {
			var wg sync.WaitGroup
			for range 20 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for range 25 {
						if _, err := b.beat(); err != nil && (errors.Is(err, jobs.ErrStaleWorker) || errors.Is(err, jobs.ErrJobTerminal)) {
							t.Errorf("heartbeat refused: %v", err)
						}
					}
				}()
			}
			wg.Wait()
		}
		cut.Cut()
		for i, backoff := range []time.Duration{time.Second, 2 * time.Second, 2 * time.Second} {
			before := hb.Stats()
			burst()
			after := hb.Stats()
			if sent, failed := after.Sent-before.Sent, after.Failed-before.Failed; sent != 1 || failed != 1 {
				t.Fatalf("step %d: 500 concurrent calls sent %d writes (%d failed), want 1", i, sent, failed)
			}
			clock.Advance(backoff)
		}
		cut.Restore()
		before := hb.Stats()
		burst()
		if after := hb.Stats(); after.Sent-before.Sent != 1 || after.Written-before.Written != 1 {
			t.Fatalf("500 concurrent calls after the outage: %+v -> %+v, want 1 sent and written", before, after)
		}
		if n := writes(t, db, "j1"); n != 1 {
			t.Fatalf("heartbeat UPDATEs = %d, want 1", n)
		}
	})

	t.Run("CallsWhileAWriteIsInFlightSendNothingEvenPastTheInterval", func(t *testing.T) {
		t.Parallel()
		db, cut, hb, clock, lease := cutHeartbeater(t, time.Second, jobs.WithOpTimeout(time.Minute))
		b := &beater{hb: hb, lease: lease}
		cut.Hang()
		type answer struct {
			res jobs.HeartbeatResult
			err error
		}
		first := make(chan answer, 1)
		go func() {
			res, err := b.beat()
			first <- answer{res, err}
		}()
		jobstest.Eventually(t, "the first heartbeat waits for its connection", func() bool { return cut.Held() == 1 })
		clock.Advance(3 * time.Second) // past the interval: an entry without a write in flight is swept
		res, err := b.beat()
		if err != nil || !res.Throttled || res.Sent {
			t.Fatalf("call while the attempt's write is in flight = %+v, %v; want throttled", res, err)
		}
		cut.Restore()
		a := <-first
		if a.err != nil || !a.res.Written {
			t.Fatalf("the held heartbeat = %+v, %v; want written once the connection came", a.res, a.err)
		}
		if st := hb.Stats(); st.Sent != 1 || st.Throttled != 1 {
			t.Fatalf("stats = %+v, want 1 sent and 1 throttled", st)
		}
		if n := writes(t, db, "j1"); n != 1 {
			t.Fatalf("heartbeat UPDATEs = %d, want 1", n)
		}
	})

	t.Run("ARefusalIsStillRememberedWithoutARetry", func(t *testing.T) {
		t.Parallel()
		db, cut, hb, clock, lease := cutHeartbeater(t, 10*time.Second)
		b := &beater{hb: hb, lease: lease}
		cut.Cut()
		outageSteps(t, b, clock, []time.Duration{time.Second})
		cut.Restore()
		claim(t, db.Store(), "j1", 1, "w2")
		_, err := b.beat()
		requireIs(t, err, jobs.ErrStaleWorker)
		clock.Advance(time.Second)
		res, err := b.beat()
		requireIs(t, err, jobs.ErrStaleWorker)
		if res.Sent {
			t.Fatalf("call after a refusal = %+v, want nothing sent", res)
		}
		if st := hb.Stats(); st.Sent != 2 || st.Failed != 1 || st.Refused != 2 {
			t.Fatalf("stats = %+v, want 2 sent, 1 failed, 2 refused", st)
		}
	})
}
