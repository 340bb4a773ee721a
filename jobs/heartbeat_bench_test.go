package jobs_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
)

// BenchmarkScaleHeartbeat makes 10,000 heartbeat calls per second for 10
// seconds across 100 live attempts of one process, each call with a
// higher progress mark, on the default 5-minute interval, and counts the
// UPDATEs PostgreSQL received (a trigger records each one). The goal is at
// most one write per attempt per interval: 100. Each iteration takes 10
// seconds; run it with -benchtime 1x.
func BenchmarkScaleHeartbeat(b *testing.B) {
	const (
		attempts = 100
		perSec   = 10000
		runFor   = 10 * time.Second
	)
	b.Run(fmt.Sprintf("N=%d", attempts), func(b *testing.B) {
		ctx := context.Background()
		db := jobstest.New(b)
		db.JobType(b, "report.export", "30 minutes", "", "")
		db.Exec(b, `
CREATE TABLE heartbeat_writes (job_id text NOT NULL);
CREATE FUNCTION record_heartbeat_write() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO heartbeat_writes (job_id) VALUES (NEW.id);
    RETURN NEW;
END $$;
CREATE TRIGGER heartbeat_writes AFTER UPDATE ON jobs FOR EACH ROW
    WHEN (OLD.progress_mark IS DISTINCT FROM NEW.progress_mark AND OLD.generation = NEW.generation)
    EXECUTE FUNCTION record_heartbeat_write();`)
		store := db.Store()
		var updates, calls int64
		for range b.N {
			db.Exec(b, `TRUNCATE heartbeat_writes`)
			hb, err := jobs.NewHeartbeater(store, nil, 0)
			if err != nil {
				b.Fatal(err)
			}
			leases := make([]jobs.Lease, attempts)
			for i := range leases {
				id := fmt.Sprintf("hb-%d-%03d", time.Now().UnixNano(), i)
				db.Insert(b, jobstest.Job{ID: id, Type: "report.export", Status: jobs.StatusQueued})
				if leases[i], err = store.Claim(ctx, id, 0, "w1"); err != nil {
					b.Fatal(err)
				}
			}
			var made atomic.Int64
			var wg sync.WaitGroup
			end := time.Now().Add(runFor)
			for _, lease := range leases {
				wg.Add(1)
				go func() {
					defer wg.Done()
					tick := time.NewTicker(time.Second * attempts / perSec)
					defer tick.Stop()
					var mark int64
					for time.Now().Before(end) {
						<-tick.C
						mark++
						if _, err := hb.Heartbeat(ctx, lease, mark); err != nil {
							b.Error(err)
							return
						}
						made.Add(1)
					}
				}()
			}
			wg.Wait()
			updates += db.Count(b, `SELECT count(*) FROM heartbeat_writes`)
			calls += made.Load()
		}
		b.ReportMetric(float64(updates)/float64(b.N), "updates")
		b.ReportMetric(attempts, "jobs")
		b.ReportMetric(float64(calls)/float64(b.N)/runFor.Seconds(), "calls/s")
	})
}
