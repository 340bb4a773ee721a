package jobs_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
)

func TestHeartbeat(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("ThousandCallsFromFiftyGoroutinesWithinOneIntervalMakeExactlyOneUpdate", func(t *testing.T) {
		t.Parallel()
		db, store := setup(t, nil)
		countWrites(t, db)
		lease := queued(t, db, store, jobstest.Job{ID: "j1", Type: "crawl.site"}, "w1")
		hb, clock := heartbeater(t, store)
		var wg sync.WaitGroup
		start := make(chan struct{})
		for g := range 50 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				for i := range 20 {
					if _, err := hb.Heartbeat(ctx, lease, int64(g*20+i+1)); err != nil {
						t.Errorf("heartbeat: %v", err)
					}
					clock.Advance(time.Millisecond) // 1,000 calls span 1 s of the 5-min interval
				}
			}()
		}
		close(start)
		wg.Wait()
		if n := writes(t, db, "j1"); n != 1 {
			t.Fatalf("heartbeat UPDATEs = %d, want 1", n)
		}
		st := hb.Stats()
		if st.Calls != 1000 || st.Sent != 1 || st.Written != 1 || st.Throttled != 999 {
			t.Fatalf("stats = %+v, want 1000 calls, 1 sent, 1 written, 999 throttled", st)
		}
	})

	t.Run("RepeatedCallsWithTheSameProgressMarkMakeNoWrite", func(t *testing.T) {
		t.Parallel()
		db, store := setup(t, nil)
		countWrites(t, db)
		lease := queued(t, db, store, jobstest.Job{ID: "j1", Type: "crawl.site"}, "w1")
		hb, clock := heartbeater(t, store)
		res, err := hb.Heartbeat(ctx, lease, 7)
		requireNoErr(t, err)
		if !res.Written {
			t.Fatalf("first heartbeat = %+v, want written", res)
		}
		before := db.Read(t, "j1").UpdatedAt
		for range 5 {
			clock.Advance(jobs.HeartbeatIntervalDefault)
			res, err := hb.Heartbeat(ctx, lease, 7)
			requireNoErr(t, err)
			if !res.Sent || res.Written {
				t.Fatalf("heartbeat with the same mark = %+v, want sent and not written", res)
			}
		}
		if n := writes(t, db, "j1"); n != 1 {
			t.Fatalf("heartbeat UPDATEs = %d, want 1", n)
		}
		if r := db.Read(t, "j1"); !r.UpdatedAt.Equal(before) || r.ProgressMark != 7 {
			t.Fatalf("row = %+v, want updated_at %v and mark 7", r, before)
		}
	})

	t.Run("AdvancingMarkAfterTheIntervalWritesAgain", func(t *testing.T) {
		t.Parallel()
		db, store := setup(t, nil)
		countWrites(t, db)
		lease := queued(t, db, store, jobstest.Job{ID: "j1", Type: "crawl.site"}, "w1")
		hb, clock := heartbeater(t, store)
		for mark := int64(1); mark <= 3; mark++ {
			res, err := hb.Heartbeat(ctx, lease, mark)
			requireNoErr(t, err)
			if !res.Written {
				t.Fatalf("heartbeat %d = %+v, want written", mark, res)
			}
			clock.Advance(jobs.HeartbeatIntervalDefault)
		}
		if n := writes(t, db, "j1"); n != 3 {
			t.Fatalf("heartbeat UPDATEs = %d, want 3", n)
		}
	})

	t.Run("OldGenerationHeartbeatChangesNothingAndIsStale", func(t *testing.T) {
		t.Parallel()
		db, store := setup(t, nil)
		countWrites(t, db)
		old := queued(t, db, store, jobstest.Job{ID: "j1", Type: "crawl.site"}, "w1")
		claim(t, store, "j1", 1, "w2")
		before := db.Read(t, "j1").UpdatedAt
		hb, _ := heartbeater(t, store)
		res, err := hb.Heartbeat(ctx, old, 100)
		requireIs(t, err, jobs.ErrStaleWorker)
		if !res.Sent || res.Written || jobs.ErrorCode(err) != "stale_worker" {
			t.Fatalf("stale heartbeat = %+v, code %q", res, jobs.ErrorCode(err))
		}
		r := requireRow(t, db, "j1", jobs.StatusProcessing, 2, 0)
		if !r.UpdatedAt.Equal(before) || r.ProgressMark != 0 || writes(t, db, "j1") != 0 {
			t.Fatalf("row = %+v, want updated_at %v, mark 0, no write", r, before)
		}
		d := requireLate(t, db, "j1", [2]string{"Heartbeat", "stale_worker"})
		if d[0].StaleGeneration != 1 || d[0].CurrentGeneration != 2 || d[0].CurrentStatus != jobs.StatusProcessing || d[0].FencingToken != "j1:1" {
			t.Fatalf("late result detail = %+v", d[0])
		}
	})

	t.Run("HeartbeatOfAReapedJobIsTerminalAndLeavesUpdatedAt", func(t *testing.T) {
		t.Parallel()
		db, store := setup(t, nil)
		lease := queued(t, db, store, jobstest.Job{ID: "j1", Type: "report.export"}, "w1")
		backdate(t, db, "j1", 40*time.Minute, 20*time.Minute)
		if !reap(t, store, "j1") {
			t.Fatal("job was not reaped")
		}
		before := db.Read(t, "j1").UpdatedAt
		hb, _ := heartbeater(t, store)
		_, err := hb.Heartbeat(ctx, lease, 1)
		requireIs(t, err, jobs.ErrJobTerminal)
		if r := requireRow(t, db, "j1", jobs.StatusFailed, 1, 0); !r.UpdatedAt.Equal(before) {
			t.Fatalf("updated_at moved from %v to %v", before, r.UpdatedAt)
		}
		requireLate(t, db, "j1", [2]string{"Heartbeat", "job_terminal"})
	})

	t.Run("LimiterForgetsJobsAfterTheInterval", func(t *testing.T) {
		t.Parallel()
		db, store := setup(t, nil)
		var leases []jobs.Lease
		for i := range 30 {
			leases = append(leases, queued(t, db, store, jobstest.Job{ID: fmt.Sprintf("j%d", i), Type: "crawl.site"}, "w1"))
		}
		hb, clock := heartbeater(t, store)
		for _, l := range leases {
			_, err := hb.Heartbeat(ctx, l, 1)
			requireNoErr(t, err)
		}
		if n := hb.Tracked(); n != 30 {
			t.Fatalf("tracked = %d, want 30", n)
		}
		clock.Advance(jobs.HeartbeatIntervalDefault)
		_, err := hb.Heartbeat(ctx, leases[0], 2)
		requireNoErr(t, err)
		if n := hb.Tracked(); n != 1 {
			t.Fatalf("tracked after one interval = %d, want 1 (only the job just seen)", n)
		}
	})

	t.Run("NewHeartbeaterRefusesANegativeIntervalAndDefaultsZero", func(t *testing.T) {
		t.Parallel()
		store := jobs.NewStore(nil)
		_, err := jobs.NewHeartbeater(store, nil, -time.Second)
		requireIs(t, err, jobs.ErrInvalidArgument)
		_, err = jobs.NewHeartbeater(nil, nil, 0)
		requireIs(t, err, jobs.ErrInvalidArgument)
		hb, err := jobs.NewHeartbeater(store, nil, 0)
		requireNoErr(t, err)
		if hb.Interval() != 5*time.Minute {
			t.Fatalf("interval = %s, want 5m", hb.Interval())
		}
	})
}
