package main

import (
	"bytes"
	"context"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
	"github.com/jobreaper/jobreaper/queue"
)

// The daemon over real PostgreSQL and Redis, after a scripted set of
// active jobs: /metrics shows the job at risk by type and queue, and the
// reap's delay in jobreaper_reap_delay_seconds (runtime 31 min of 30, idle
// 21 of 15: reapable for min(6, 1) = 1 minute, in the (32, 64] bucket).
func TestDaemonExportsJobsAtRiskAndReapDelay(t *testing.T) {
	t.Parallel()
	db := jobstest.New(t)
	rdb := realRedis(t)
	q := unique("atrisk")
	db.JobType(t, "report.export", "30 minutes", "", "")
	stalled, risky, busy := unique("J-stalled"), unique("J-risky"), unique("J-busy")
	db.Insert(t, jobstest.Job{ID: stalled, Type: "report.export", Generation: 1, Queue: q, Worker: "w1",
		StartedAgo: jobstest.Ago(31 * time.Minute), IdleAgo: 21 * time.Minute})
	db.Insert(t, jobstest.Job{ID: risky, Type: "report.export", Generation: 1, Queue: q, Worker: "w2",
		StartedAgo: jobstest.Ago(45 * time.Minute), IdleAgo: 10 * time.Minute})
	db.Insert(t, jobstest.Job{ID: busy, Type: "report.export", Generation: 1, Queue: q, Worker: "w3",
		StartedAgo: jobstest.Ago(45 * time.Minute), IdleAgo: 2 * time.Minute})
	for _, id := range []string{stalled, risky, busy} {
		activeTask(t, id, q)
	}
	t.Cleanup(func() { rdb.Del(context.WithoutCancel(t.Context()), queue.MarkerKey(stalled)) })

	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var stdout bytes.Buffer
	var stderr jobstest.SyncBuffer
	done := make(chan int, 1)
	go func() {
		done <- execute(ctx, []string{"run", "--database-url", db.URL, "--schema", db.Schema,
			"--redis-url", redisTestURL(), "--queues", q, "--interval", "200ms", "--outage-grace=false",
			"--stall-timeout", "15m", "--start-jitter", "0s", "--metrics-addr", "127.0.0.1:0"}, &stdout, &stderr)
	}()
	addrRE := regexp.MustCompile(`serving /metrics and /healthz" component=metrics addr=(\S+)`)
	var addr string
	jobstest.Eventually(t, "the metrics server listens", func() bool {
		if m := addrRE.FindStringSubmatch(stderr.String()); m != nil {
			addr = m[1]
		}
		return addr != ""
	})
	series := []string{
		`jobreaper_jobs_at_risk{queue="` + q + `",type="report.export"} 1`,
		`jobreaper_reap_delay_seconds_bucket{reason="stalled",type="report.export",le="32"} 0`,
		`jobreaper_reap_delay_seconds_bucket{reason="stalled",type="report.export",le="64"} 1`,
		`jobreaper_reap_delay_seconds_count{reason="stalled",type="report.export"} 1`,
	}
	var body string
	jobstest.Eventually(t, "the pass's jobs at risk and reap delay are exported", func() bool {
		body = get(t, "http://"+addr+"/metrics")
		for _, s := range series {
			if !strings.Contains(body, s+"\n") {
				return false
			}
		}
		return true
	})
	// Later passes keep the one job at risk and observe no second reap.
	jobstest.Eventually(t, "three passes ran", func() bool {
		return strings.Contains(get(t, "http://"+addr+"/metrics"), `jobreaper_passes_total{outcome="ok"} 3`)
	})
	body = get(t, "http://"+addr+"/metrics")
	for _, s := range series {
		if !strings.Contains(body, s+"\n") {
			t.Errorf("/metrics lacks %s", s)
		}
	}
	if strings.Count(body, "jobreaper_jobs_at_risk{") != 1 {
		t.Errorf("/metrics has other jobs at risk:\n%s", grepLines(body, "jobreaper_jobs_at_risk"))
	}
	if row := db.Read(t, stalled); row.Status != jobs.StatusFailed {
		t.Fatalf("the stalled job = %+v, want FAILED", row)
	}
	cancel()
	select {
	case code := <-done:
		if code != exitOK {
			t.Fatalf("exit code %d; stderr:\n%s", code, stderr.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the daemon did not stop within 10s of cancellation")
	}
}

// grepLines returns the lines of s that contain word.
func grepLines(s, word string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, word) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
