package jobs_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
)

func TestWorkerMetrics(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	reg := prometheus.NewRegistry()
	db := jobstest.New(t)
	baselineTypes(t, db)
	store := db.Store(jobs.WithRegisterer(reg))
	// A second Store on the same registry shares the counters.
	_ = db.Store(jobs.WithRegisterer(reg))

	late := func(kind string) float64 {
		return testutil.ToFloat64(mustVec(t, reg, "jobreaper_late_results_refused_total", "kind", kind))
	}
	calls := func(result string) float64 {
		return testutil.ToFloat64(mustVec(t, reg, "jobreaper_heartbeat_calls_total", "result", result))
	}
	if n, err := testutil.GatherAndCount(reg, "jobreaper_late_results_refused_total", "jobreaper_heartbeat_calls_total"); err != nil || n != 7 {
		t.Fatalf("series at start = %d (%v), want 4 kinds + 3 results at 0", n, err)
	}

	hb, clock := heartbeater(t, store)
	lease := queued(t, db, store, jobstest.Job{ID: "M1", Type: "report.export"}, "w1")
	_, err := hb.Heartbeat(ctx, lease, 1) // written
	requireNoErr(t, err)
	_, err = hb.Heartbeat(ctx, lease, 2) // throttled
	requireNoErr(t, err)
	clock.Advance(6 * time.Minute)
	_, err = hb.Heartbeat(ctx, lease, 1) // unchanged: the mark did not advance
	requireNoErr(t, err)
	if calls("written") != 1 || calls("throttled") != 1 || calls("unchanged") != 1 {
		t.Fatalf("heartbeat calls = written %v throttled %v unchanged %v, want 1 each", calls("written"), calls("throttled"), calls("unchanged"))
	}

	// A newer attempt supersedes lease: its Complete, Advance, Fail and
	// Heartbeat are refused.
	db.Exec(t, `UPDATE jobs SET generation = 2 WHERE id = 'M1'`)
	_, err = store.CompleteWith(ctx, db.Pool, lease, func(pgx.Tx) error { return nil })
	requireIs(t, err, jobs.ErrStaleWorker)
	err = inTx(t, db, func(tx pgx.Tx) error {
		_, err := store.Advance(ctx, tx, lease, "page-1", 0, 1)
		return err
	})
	requireIs(t, err, jobs.ErrStaleWorker)
	requireIs(t, store.Fail(ctx, lease, "upstream_timeout"), jobs.ErrStaleWorker)
	clock.Advance(6 * time.Minute)
	_, err = hb.Heartbeat(ctx, lease, 3)
	requireIs(t, err, jobs.ErrStaleWorker)
	_, err = hb.Heartbeat(ctx, lease, 4) // answered from the recorded refusal
	requireIs(t, err, jobs.ErrStaleWorker)
	if late("complete") != 1 || late("advance") != 1 || late("fail") != 1 || late("heartbeat") != 2 {
		t.Fatalf("late results = complete %v advance %v fail %v heartbeat %v, want 1 1 1 2",
			late("complete"), late("advance"), late("fail"), late("heartbeat"))
	}
}

// mustVec returns the counter of name with label=value from reg.
func mustVec(t *testing.T, reg *prometheus.Registry, name, label, value string) prometheus.Collector {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == label && lp.GetValue() == value {
					c := prometheus.NewCounter(prometheus.CounterOpts{Name: "x"})
					c.Add(m.GetCounter().GetValue())
					return c
				}
			}
		}
	}
	t.Fatalf("no series %s{%s=%q}", name, label, value)
	return nil
}
