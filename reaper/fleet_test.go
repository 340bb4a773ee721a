package reaper_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/jobreaper/jobreaper/internal/asynqstate"
	"github.com/jobreaper/jobreaper/internal/pgstore"
	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
	"github.com/jobreaper/jobreaper/reaper"
)

// A dry run over stalled jobs changes no row, event or marker, and lists
// every decision, from the same decision code as a real pass.
func TestDryRun(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, func(o *reaper.Options) { o.DryRun = true })
	b.stalled(t, "J5")
	b.stalled(t, "J6")
	b.db.Insert(t, jobstest.Job{ID: "fresh", Type: "report.export", Generation: 1, Queue: "default",
		StartedAgo: jobstest.Ago(time.Minute), IdleAgo: time.Minute})
	// A lost task: stalled, not active, asynq will never run it.
	b.db.Insert(t, jobstest.Job{ID: "lost", Type: "report.export", Generation: 1, Queue: "default",
		StartedAgo: jobstest.Ago(31 * time.Minute), IdleAgo: 21 * time.Minute})
	b.lister.queues["default"] = asynqstate.ActiveTasks{IDs: []string{"J5", "J6", "fresh", "ghost"}}
	before := b.db.Count(t, `SELECT count(*) FROM jobs WHERE status = 'PROCESSING'`)

	res, err := runOnce(t, ctx, b.reaper)
	if err != nil {
		t.Fatal(err)
	}
	if res.Reaped != 3 || res.Errors != 0 || res.Skipped["within_limit"] != 1 || res.Skipped["no_row"] != 1 {
		t.Fatalf("result = %+v, want 3 would-be reaps, within_limit 1, no_row 1", res)
	}
	got := map[string]reaper.Decision{}
	for _, d := range res.Decisions {
		got[d.JobID] = d
	}
	want := map[string][2]string{
		"J5": {"reap", "stalled"}, "J6": {"reap", "stalled"}, "fresh": {"skip", "within_limit"},
		"ghost": {"skip", "no_row"}, "lost": {"reap", "lost_task"},
	}
	if len(got) != len(want) || len(res.Decisions) != len(want) {
		t.Fatalf("decisions = %+v, want one for each of %v", res.Decisions, want)
	}
	for id, w := range want {
		if d := got[id]; d.Decision != w[0] || d.Reason != w[1] {
			t.Errorf("decision on %s = %+v, want %s %s", id, d, w[0], w[1])
		}
	}
	if d := got["J5"]; d.Type != "report.export" || d.Queue != "default" || d.Generation != 1 ||
		d.MaxRuntimeSeconds != 1800 || d.StallTimeoutSeconds != 900 || d.RuntimeSeconds < 31*60 || d.IdleSeconds < 21*60 {
		t.Fatalf("J5's decision = %+v", d)
	}
	if n := b.db.Count(t, `SELECT count(*) FROM jobs WHERE status = 'PROCESSING'`); n != before {
		t.Fatalf("PROCESSING rows %d -> %d: the dry run wrote", before, n)
	}
	if n := b.db.Count(t, `SELECT count(*) FROM job_events`); n != 0 {
		t.Fatalf("%d events written by a dry run", n)
	}
	if keys := b.redis.Keys(); len(keys) != 0 {
		t.Fatalf("Redis keys after a dry run: %v", keys)
	}
}

// TestCase_B31_ReplicasCompareTheSettingsThatDecideAReap: three replicas of
// one queue set, one deployed with --stall-timeout 60m, the others with the
// default 15m. The replica whose settings differ from the leader's logs an
// error naming the setting and both values and sets
// jobreaper_settings_drift to 1; the others stay at 0.
func TestCase_B31_ReplicasCompareTheSettingsThatDecideAReap(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := jobstest.New(t)
	store := db.Daemon()
	queues := []string{"reports"}
	type replica struct {
		lease *reaper.LeaderLease
		reg   *prometheus.Registry
		log   *logBuffer
	}
	newReplica := func(stall time.Duration) replica {
		reg := prometheus.NewRegistry()
		log := &logBuffer{}
		settings := reaper.NewSettings(time.Minute, 5*time.Minute, stall, queues, nil)
		l := reaper.NewLeaderLease(store, queues, pgstore.NewLeaderLeaseHolder(time.Now()), time.Minute, settings,
			slog.New(slog.NewTextHandler(log, nil)), reaper.NewMetrics(reg))
		return replica{l, reg, log}
	}
	leader, same, drifted := newReplica(15*time.Minute), newReplica(15*time.Minute), newReplica(60*time.Minute)
	if !leader.lease.Attempt(ctx) {
		t.Fatal("the first replica did not take the leader lease")
	}
	if same.lease.Attempt(ctx) || drifted.lease.Attempt(ctx) {
		t.Fatal("a second replica took a valid leader lease")
	}
	drift := func(r replica) float64 { return metricValue(t, r.reg, "jobreaper_settings_drift", map[string]string{}) }
	if drift(drifted) != 1 || drift(same) != 0 || drift(leader) != 0 {
		t.Fatalf("jobreaper_settings_drift: drifted %v, same %v, leader %v; want 1, 0, 0", drift(drifted), drift(same), drift(leader))
	}
	logged := strings.Join(drifted.log.take(), "\n")
	if !strings.Contains(logged, "level=ERROR") || !strings.Contains(logged, "settings drift") ||
		!strings.Contains(logged, "stall_timeout: this replica 1h0m0s, the leader 15m0s") {
		t.Fatalf("the drifted replica's log does not name the setting and both values:\n%s", logged)
	}
	if sameLog := strings.Join(same.log.take(), "\n"); strings.Contains(sameLog, "settings drift") {
		t.Fatalf("a replica with the leader's settings reported drift:\n%s", sameLog)
	}
	if metricValue(t, leader.reg, "jobreaper_leader", map[string]string{}) != 1 || metricValue(t, same.reg, "jobreaper_leader", map[string]string{}) != 0 {
		t.Fatal("jobreaper_leader is not 1 on the leader and 0 on a follower")
	}
	// Cascades count by digest.
	withCascade := reaper.NewSettings(time.Minute, 5*time.Minute, 15*time.Minute, queues,
		jobs.Cascades{"report.export": {OnFailed: []string{"UPDATE parents SET n = n + 1 WHERE id = @parent_id"}}})
	if withCascade.Cascades == reaper.NewSettings(time.Minute, 5*time.Minute, 15*time.Minute, queues, nil).Cascades {
		t.Fatal("different cascades have the same digest")
	}
}
