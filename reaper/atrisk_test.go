package reaper_test

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/jobreaper/jobreaper/internal/asynqstate"
	"github.com/jobreaper/jobreaper/internal/pgstore"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
	"github.com/jobreaper/jobreaper/reaper"
)

// AtRisk is the one predicate of the early warning: a job left alone past
// max_runtime whose idle time reached half its stall timeout.
func TestAtRisk(t *testing.T) {
	t.Parallel()
	const stall = 15 * time.Minute
	v := func(skip reaper.SkipReason, runtime, idle time.Duration) reaper.Verdict {
		return reaper.Verdict{Skip: skip, Runtime: runtime, Idle: idle, MaxRuntime: 30 * time.Minute, StallTimeout: stall}
	}
	for _, c := range []struct {
		name string
		v    reaper.Verdict
		want bool
	}{
		{"ProgressingIdleHalfTheStallTimeout", v(reaper.SkipProgressing, time.Hour, stall/2), true},
		{"ProgressingIdleJustUnderHalf", v(reaper.SkipProgressing, time.Hour, stall/2-time.Microsecond), false},
		{"ProgressingIdleJustUnderTheStallTimeout", v(reaper.SkipProgressing, 31*time.Minute, stall-time.Microsecond), true},
		{"OutageGrace", v(reaper.SkipOutageGrace, time.Hour, 40*time.Minute), true},
		{"StallStormHeld", v(reaper.SkipStallStormHeld, time.Hour, 40*time.Minute), true},
		{"WithinLimitIdleLong", v(reaper.SkipWithinLimit, 20*time.Minute, 14*time.Minute), false},
		{"BadLimits", v(reaper.SkipBadLimits, time.Hour, time.Hour), false},
		{"AwaitingRetry", v(reaper.SkipAwaitingRetry, time.Hour, time.Hour), false},
		{"ReapIsNotAtRisk", reaper.Verdict{Reap: true, Runtime: time.Hour, Idle: time.Hour, MaxRuntime: 30 * time.Minute, StallTimeout: stall}, false},
		{"AnOddStallTimeoutRoundsHalfUp", reaper.Verdict{Skip: reaper.SkipProgressing, Runtime: time.Hour, MaxRuntime: time.Minute,
			StallTimeout: 3, Idle: 1}, false},
	} {
		if got := reaper.AtRisk(c.v); got != c.want {
			t.Errorf("%s: AtRisk(%+v) = %v, want %v", c.name, c.v, got, c.want)
		}
	}
}

// histogram returns the series of histogram name with exactly labels in
// reg, nil when it does not exist.
func histogram(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) *dto.Histogram {
	t.Helper()
	if m := findSeries(t, reg, name, labels); m != nil {
		return m.GetHistogram()
	}
	return nil
}

// seriesCount returns how many series name has in reg.
func seriesCount(t *testing.T, reg *prometheus.Registry, name string) int {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() == name {
			return len(f.GetMetric())
		}
	}
	return 0
}

// A scripted pass over jobs whose runtimes and idle times are known: the
// jobs at risk are counted per type and queue, the reaps' delays land in
// jobreaper_reap_delay_seconds (idle counted from the outage end where it
// is later than the last progress), and a second pass drops the series
// of a pair no longer at risk.
func TestJobsAtRiskAndReapDelayAfterAScriptedPass(t *testing.T) {
	t.Parallel()
	b := setup(t, func(o *reaper.Options) { o.OutageGrace = true })
	db := b.db
	// An outage ended 20 minutes ago, after the grace job's last progress.
	db.Exec(t, `INSERT INTO reaper_outages (database, outage_end, cause, timeline, postmaster_start, recorded_by, recorded_at)
SELECT current_database(), now() - interval '20 minutes', 'first_record', (SELECT timeline_id FROM pg_control_checkpoint()),
       pg_postmaster_start_time(), 'test', now()`)
	job := func(id, typ, q string, started, idle time.Duration) {
		db.Insert(t, jobstest.Job{ID: id, Type: typ, Generation: 1, Queue: q, Worker: "w",
			StartedAgo: jobstest.Ago(started), IdleAgo: idle})
	}
	// report.export: 30 min max_runtime; crawl.site: 60; stall 15 min.
	job("reap-idle", "report.export", "default", 50*time.Minute, 18*time.Minute)    // min(18-15, 50-30) = 3 min
	job("reap-runtime", "report.export", "default", 33*time.Minute, 30*time.Minute) // min(30-15, 33-30) = 3 min
	job("reap-grace", "crawl.site", "default", 2*time.Hour, 50*time.Minute)         // idle from the outage end: min(20-15, 60) = 5 min
	job("risk-crawl", "crawl.site", "default", 2*time.Hour, 9*time.Minute)          // 9 >= 7.5: at risk
	job("safe-crawl", "crawl.site", "default", 2*time.Hour, 7*time.Minute)          // 7 < 7.5: not at risk
	job("risk-other", "report.export", "other", 40*time.Minute, 8*time.Minute)      // at risk in queue other
	job("young", "report.export", "other", 10*time.Minute, 9*time.Minute)           // within limit
	b.lister.queues["default"] = asynqstate.ActiveTasks{IDs: []string{"reap-idle", "reap-runtime", "reap-grace", "risk-crawl", "safe-crawl"}}
	b.lister.queues["other"] = asynqstate.ActiveTasks{IDs: []string{"risk-other", "young"}}

	res, err := runOnce(t, t.Context(), b.reaper)
	if err != nil {
		t.Fatal(err)
	}
	if res.Reaped != 3 || res.AtRisk != 2 || res.Errors != 0 {
		t.Fatalf("result = %+v, want 3 reaped, 2 at risk", res)
	}
	for _, c := range []struct {
		typ, queue string
		want       float64
	}{{"crawl.site", "default", 1}, {"report.export", "other", 1}} {
		if got := metricValue(t, b.reg, "jobreaper_jobs_at_risk", map[string]string{"type": c.typ, "queue": c.queue}); got != c.want {
			t.Errorf("jobreaper_jobs_at_risk{type=%q,queue=%q} = %v, want %v", c.typ, c.queue, got, c.want)
		}
	}
	if n := seriesCount(t, b.reg, "jobreaper_jobs_at_risk"); n != 2 {
		t.Errorf("jobreaper_jobs_at_risk has %d series, want 2", n)
	}

	// reap-idle and reap-runtime: 180 s each, in the (128, 256] bucket;
	// reap-grace: idle from the outage end 20 - 15 = 5 min, runtime
	// 120 - 60 = 60 min: 300 s, in (256, 512] (counted from updated_at it
	// would be 35 min).
	const slack = 30.0 // the seconds between the inserts and the pass
	for _, c := range []struct {
		typ   string
		count uint64
		sum   float64
		le    float64
	}{{"report.export", 2, 360, 256}, {"crawl.site", 1, 300, 512}} {
		h := histogram(t, b.reg, "jobreaper_reap_delay_seconds", map[string]string{"type": c.typ, "reason": "stalled"})
		if h == nil || h.GetSampleCount() != c.count || h.GetSampleSum() < c.sum || h.GetSampleSum() > c.sum+slack*float64(c.count) {
			t.Fatalf("jobreaper_reap_delay_seconds{type=%q,reason=stalled} = %v, want %d sample(s) summing to %v s", c.typ, h, c.count, c.sum)
		}
		// Every sample is in the bucket ending at le.
		for _, bk := range h.GetBucket() {
			want := uint64(0)
			if bk.GetUpperBound() >= c.le {
				want = c.count
			}
			if bk.GetCumulativeCount() != want {
				t.Fatalf("%s delay bucket le=%v holds %d, want %d", c.typ, bk.GetUpperBound(), bk.GetCumulativeCount(), want)
			}
		}
	}

	// risk-other records progress; risk-crawl stays at risk.
	db.Exec(t, `UPDATE jobs SET updated_at = now() WHERE id = 'risk-other'`)
	if res, err = runOnce(t, t.Context(), b.reaper); err != nil || res.AtRisk != 1 {
		t.Fatalf("second pass = %+v, %v; want 1 at risk", res, err)
	}
	if n := seriesCount(t, b.reg, "jobreaper_jobs_at_risk"); n != 1 {
		t.Fatalf("jobreaper_jobs_at_risk has %d series after the second pass, want 1 (crawl.site/default)", n)
	}
	if got := metricValue(t, b.reg, "jobreaper_jobs_at_risk", map[string]string{"type": "crawl.site", "queue": "default"}); got != 1 {
		t.Fatalf("jobreaper_jobs_at_risk{crawl.site,default} = %v after the second pass, want 1", got)
	}
	// No new reap, no new delay.
	if h := histogram(t, b.reg, "jobreaper_reap_delay_seconds", map[string]string{"type": "report.export", "reason": "stalled"}); h.GetSampleCount() != 2 {
		t.Fatalf("the second pass observed delays: %v", h)
	}
}

// A dry run marks each decision at risk or not, by the same predicate, and
// counts them in the summary; the reasons stay as they were.
func TestDryRunMarksDecisionsAtRisk(t *testing.T) {
	t.Parallel()
	b := setup(t, func(o *reaper.Options) { o.DryRun = true })
	b.db.Insert(t, jobstest.Job{ID: "stalled", Type: "report.export", Generation: 1, Queue: "default",
		StartedAgo: jobstest.Ago(31 * time.Minute), IdleAgo: 21 * time.Minute})
	b.db.Insert(t, jobstest.Job{ID: "risky", Type: "crawl.site", Generation: 1, Queue: "default",
		StartedAgo: jobstest.Ago(2 * time.Hour), IdleAgo: 10 * time.Minute})
	b.db.Insert(t, jobstest.Job{ID: "busy", Type: "crawl.site", Generation: 1, Queue: "default",
		StartedAgo: jobstest.Ago(2 * time.Hour), IdleAgo: time.Minute})
	b.lister.queues["default"] = asynqstate.ActiveTasks{IDs: []string{"stalled", "risky", "busy"}}
	res, err := runOnce(t, t.Context(), b.reaper)
	if err != nil || res.AtRisk != 1 || len(res.Decisions) != 3 {
		t.Fatalf("dry run = %+v, %v", res, err)
	}
	want := map[string]struct {
		reason string
		atRisk bool
	}{"stalled": {"stalled", false}, "risky": {"progressing", true}, "busy": {"progressing", false}}
	for _, d := range res.Decisions {
		if w := want[d.JobID]; d.Reason != w.reason || d.AtRisk != w.atRisk {
			t.Errorf("decision on %s = %s at_risk %v, want %s at_risk %v", d.JobID, d.Reason, d.AtRisk, w.reason, w.atRisk)
		}
	}
}

// jobreaper_jobs_at_risk is exported only by the replica that runs
// passes: a replica whose leader lease is not held (a follower) exports
// no series, so a sum over the replicas counts each job once.
func TestJobsAtRiskOnlyFromTheReplicaHoldingTheLeaderLease(t *testing.T) {
	t.Parallel()
	db := jobstest.New(t)
	db.JobType(t, "crawl.site", "60 minutes", "", "")
	db.Insert(t, jobstest.Job{ID: "risky", Type: "crawl.site", Generation: 1, Queue: "reports",
		StartedAgo: jobstest.Ago(2 * time.Hour), IdleAgo: 10 * time.Minute})
	queues := []string{"reports"}
	reg := prometheus.NewRegistry()
	m := reaper.NewMetrics(reg)
	lease := reaper.NewLeaderLease(db.Daemon(), queues, pgstore.NewLeaderLeaseHolder(time.Now()), time.Minute,
		reaper.NewSettings(time.Minute, 5*time.Minute, 15*time.Minute, queues, nil), testLogger(t), m)
	lister := &fakeLister{queues: map[string]asynqstate.ActiveTasks{"reports": {IDs: []string{"risky"}}}, failed: map[string]error{}}
	r := reaper.New(db.Daemon(), lister, newMarkers(t, miniRedisClient(t)), reaper.Options{Queues: queues, Rule: baselineRule,
		Logger: testLogger(t), Metrics: m, LeaderLease: lease})
	// RunOnce neither takes nor checks the leader lease: the pass counts
	// the job, but a replica that does not hold the lease hides it.
	if res, err := runOnce(t, t.Context(), r); err != nil || res.AtRisk != 1 {
		t.Fatalf("pass = %+v, %v; want 1 at risk", res, err)
	}
	if n := seriesCount(t, reg, "jobreaper_jobs_at_risk"); n != 0 {
		t.Fatalf("a replica without the leader lease exports %d series of jobreaper_jobs_at_risk, want none", n)
	}
	if !lease.Attempt(t.Context()) {
		t.Fatal("the replica could not take the leader lease")
	}
	if got := metricValue(t, reg, "jobreaper_jobs_at_risk", map[string]string{"type": "crawl.site", "queue": "reports"}); got != 1 {
		t.Fatalf("the leader's jobreaper_jobs_at_risk{crawl.site,reports} = %v, want 1", got)
	}
}
