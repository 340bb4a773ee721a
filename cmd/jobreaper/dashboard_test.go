package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
	"github.com/jobreaper/jobreaper/queue"
)

// The Grafana dashboard is valid JSON, and every series it queries is in a
// scrape of a running daemon's /metrics, so that no panel stays empty
// because a metric only appears once something happened.
func TestGrafanaDashboardQueriesAreInADaemonsScrape(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile("../../deploy/grafana-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var dashboard map[string]any
	if err := json.Unmarshal(raw, &dashboard); err != nil {
		t.Fatalf("the dashboard is not JSON: %v", err)
	}
	if _, ok := dashboard["panels"]; !ok {
		t.Fatal("the dashboard has no panels")
	}
	used := regexp.MustCompile(`jobreaper_[a-z_]+`).FindAllString(string(raw), -1)
	if len(used) == 0 {
		t.Fatal("the dashboard queries no jobreaper metric")
	}

	db := jobstest.New(t)
	q := unique("dash")
	// A job QUEUED for 2 hours whose task was never enqueued: stale, so
	// the per-queue gauge of stale QUEUED jobs has a series too (such
	// series appear with a queue's first stale job).
	db.Insert(t, jobstest.Job{ID: unique("Jstale"), Type: "report.export", Status: jobs.StatusQueued, Queue: q, IdleAgo: 2 * time.Hour})
	// An active job at risk and a stalled one, so that the gauge of jobs
	// at risk and the reap delay histogram, whose series name a type and
	// a queue, have one each.
	db.JobType(t, "report.export", "30 minutes", "", "")
	// Their queue is another one: q must stay unknown to asynq.
	active, rdb := unique("dashactive"), realRedis(t)
	risky, stalled := unique("Jrisky"), unique("Jstalled")
	db.Insert(t, jobstest.Job{ID: risky, Type: "report.export", Generation: 1, Queue: active, Worker: "w",
		StartedAgo: jobstest.Ago(45 * time.Minute), IdleAgo: 10 * time.Minute})
	db.Insert(t, jobstest.Job{ID: stalled, Type: "report.export", Generation: 1, Queue: active, Worker: "w",
		StartedAgo: jobstest.Ago(45 * time.Minute), IdleAgo: 30 * time.Minute})
	activeTask(t, risky, active)
	activeTask(t, stalled, active)
	t.Cleanup(func() { rdb.Del(context.WithoutCancel(t.Context()), queue.MarkerKey(stalled)) })
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var stdout bytes.Buffer
	var stderr jobstest.SyncBuffer
	done := make(chan int, 1)
	go func() {
		done <- execute(ctx, []string{"run", "--database-url", db.URL, "--schema", db.Schema,
			"--redis-url", redisTestURL(), "--queues", q + "," + active, "--interval", "100ms",
			"--stall-timeout", "15m", "--outage-grace=false", "--start-jitter", "0s", "--metrics-addr", "127.0.0.1:0"}, &stdout, &stderr)
	}()
	defer func() {
		cancel()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Error("the daemon did not stop")
		}
	}()
	addrRE := regexp.MustCompile(`serving /metrics and /healthz" component=metrics addr=(\S+)`)
	var addr string
	jobstest.Eventually(t, "the metrics server listens", func() bool {
		if m := addrRE.FindStringSubmatch(stderr.String()); m != nil {
			addr = m[1]
		}
		return addr != ""
	})
	// The daemon scans a queue asynq never saw, so the per-queue counter
	// of such queues has a series too.
	var scrape string
	passed := regexp.MustCompile(`(?m)^jobreaper_passes_total\{outcome="ok"\} [1-9]`)
	jobstest.Eventually(t, "a pass is counted", func() bool {
		scrape = get(t, "http://"+addr+"/metrics")
		return passed.MatchString(scrape) && strings.Contains(scrape, "jobreaper_reap_delay_seconds_count{")
	})
	exported := map[string]bool{}
	for _, line := range strings.Split(scrape, "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name, _, _ := strings.Cut(line, "{")
		name, _, _ = strings.Cut(name, " ")
		exported[name] = true
	}
	// The workers' panels query what the worker library exports: a
	// registry with a start guard and a jobs.Store holds it from the start,
	// and the runtime histogram, whose series name a type, from the first
	// attempt a worker ends.
	workers := prometheus.NewRegistry()
	queue.NewGuard(nil, nil, queue.WithRegisterer(workers))
	store := db.Store(jobs.WithRegisterer(workers))
	done2 := unique("Jdone")
	db.Insert(t, jobstest.Job{ID: done2, Type: "report.export", Status: jobs.StatusQueued})
	lease, err := store.Claim(t.Context(), done2, 0, "w")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.CompleteWith(t.Context(), nil, lease, nil); err != nil {
		t.Fatal(err)
	}
	families, err := workers.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		exported[f.GetName()] = true
		if f.GetType() == dto.MetricType_HISTOGRAM {
			for _, suffix := range []string{"_bucket", "_sum", "_count"} {
				exported[f.GetName()+suffix] = true
			}
		}
	}
	for _, name := range used {
		if !exported[name] {
			t.Errorf("the dashboard queries %s, which neither a running daemon's scrape nor a worker's registry holds", name)
		}
	}
}
