package main

import (
	"context"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"golang.org/x/net/html"

	"github.com/jobreaper/jobreaper/internal/fleettest"
	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
	"github.com/jobreaper/jobreaper/queue"
	"github.com/jobreaper/jobreaper/queue/queuetest"
)

// statusFixture is a leader and a follower daemon of one queue set with a
// reaped job (R), a job at risk (A) and a running one (N), each an active
// asynq task; R's task carries Payload, and the database URL a password.
type statusFixture struct {
	db               *jobstest.DB
	leader, follower *fleettest.Daemon
	r, a, n          string
	payload, secret  string
}

func newStatusFixture(t *testing.T) *statusFixture {
	t.Helper()
	bin := fleettest.BuildJobreaper(t)
	db := jobstest.New(t)
	f := &statusFixture{db: db, r: unique("J-reaped"), a: unique("J-risk"), n: unique("J-running"),
		payload: unique("PAYLOAD-TEXT"), secret: unique("PW")}
	q := unique("page")
	// A week of finished attempts and reaps of other types: the limits
	// table has a suggestion and a "not enough data" to show.
	seedSuggest(t, db)
	db.JobType(t, "report.export", "30 minutes", "", "")
	db.Insert(t, jobstest.Job{ID: f.r, Type: "report.export", Generation: 1, Queue: q, Worker: "W-reaped",
		StartedAgo: jobstest.Ago(31 * time.Minute), IdleAgo: 21 * time.Minute})
	// Idle 6m of an 11m stall timeout: at risk, not stalled.
	db.Insert(t, jobstest.Job{ID: f.a, Type: "report.export", Generation: 3, Queue: q, Worker: "W-risk",
		StartedAgo: jobstest.Ago(40 * time.Minute), IdleAgo: 6 * time.Minute})
	db.Insert(t, jobstest.Job{ID: f.n, Type: "report.export", Generation: 1, Queue: q, Worker: "W-running",
		StartedAgo: jobstest.Ago(time.Minute), IdleAgo: 0})
	rdb := realRedis(t)
	t.Cleanup(func() {
		ctx := context.WithoutCancel(t.Context())
		rdb.Del(ctx, queue.MarkerKey(f.r))
		_ = queuetest.Remove(ctx, rdb, q)
	})
	client := asynq.NewClientFromRedisClient(rdb)
	if _, err := client.EnqueueContext(t.Context(), asynq.NewTask("report.export", []byte(`{"note":"`+f.payload+`"}`)),
		asynq.TaskID(f.r), asynq.Queue(q), asynq.MaxRetry(0)); err != nil {
		t.Fatal(err)
	}
	// MakeActive enqueues the other two and moves every pending task of
	// the queue, R's too, to active.
	if err := queuetest.MakeActive(t.Context(), rdb, q, "report.export", []string{f.a, f.n}); err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	// The test server trusts its clients: the password is never checked,
	// only carried, as a real one would be.
	u.User = url.UserPassword(u.User.Username(), f.secret)
	opts := func(name string) fleettest.DaemonOptions {
		return fleettest.DaemonOptions{Name: name, DatabaseURL: u.String(), RedisURL: redisTestURL(),
			Args: []string{"--schema", db.Schema, "--queues", q, "--interval", "1s", "--stall-timeout", "11m", "--op-timeout", "2s"}}
	}
	f.leader = fleettest.StartDaemon(t, bin, opts("leader"))
	fleettest.WaitFor(t, "the leader leads", f.leader.Leads)
	f.follower = fleettest.StartDaemon(t, bin, opts("follower"))
	fleettest.WaitFor(t, "the leader reaps R", func() bool { return db.Read(t, f.r).Status == jobs.StatusFailed })
	return f
}

// page gets path from d's status page and parses it.
func page(t *testing.T, d *fleettest.Daemon, path string) (int, string, *html.Node) {
	t.Helper()
	code, body := fleettest.Probe(d.StatusPageAddr(t), path)
	doc, err := html.Parse(strings.NewReader(body))
	if err != nil {
		t.Fatalf("%s%s is not HTML: %v\n%s", d.Name, path, err, body)
	}
	return code, body, doc
}

// byID returns the element with id, or nil.
func byID(n *html.Node, id string) *html.Node {
	if n.Type == html.ElementNode {
		for _, a := range n.Attr {
			if a.Key == "id" && a.Val == id {
				return n
			}
		}
	}
	for c := n.FirstChild; c != nil; c = c.NextSibling {
		if f := byID(c, id); f != nil {
			return f
		}
	}
	return nil
}

// rows returns the text of each cell of each row of table, header first.
func rows(table *html.Node) [][]string {
	var out [][]string
	var walk func(*html.Node)
	walk = func(n *html.Node) {
		if n.Type == html.ElementNode && n.Data == "tr" {
			var cells []string
			for c := n.FirstChild; c != nil; c = c.NextSibling {
				if c.Type == html.ElementNode && (c.Data == "td" || c.Data == "th") {
					cells = append(cells, strings.TrimSpace(text(c)))
				}
			}
			out = append(out, cells)
			return
		}
		for c := n.FirstChild; c != nil; c = c.NextSibling {
			walk(c)
		}
	}
	if table != nil {
		walk(table)
	}
	return out
}

func text(n *html.Node) string {
	if n.Type == html.TextNode {
		return n.Data
	}
	var b strings.Builder
	for c := n.FirstChild; c != nil; c = c.NextSibling {
		b.WriteString(text(c))
	}
	return b.String()
}

// rowOf returns the row of table whose first cell is id, by header name.
func rowOf(t *testing.T, table *html.Node, id string) map[string]string {
	t.Helper()
	rs := rows(table)
	if len(rs) == 0 {
		return nil
	}
	for _, r := range rs[1:] {
		if len(r) > 0 && r[0] == id {
			m := map[string]string{}
			for i, h := range rs[0] {
				if i < len(r) {
					m[h] = r[i]
				}
			}
			return m
		}
	}
	return nil
}

// requireClean fails when body shows the payload, the password or a stack.
func (f *statusFixture) requireClean(t *testing.T, what, body string) {
	t.Helper()
	for _, bad := range []string{f.payload, f.secret, "goroutine ", "panic"} {
		if strings.Contains(body, bad) {
			t.Fatalf("%s shows %q:\n%s", what, bad, body)
		}
	}
	if strings.Contains(strings.ToLower(body), "<script") {
		t.Fatalf("%s holds a script", what)
	}
}

func TestStatusPage(t *testing.T) {
	t.Parallel()
	f := newStatusFixture(t)
	// The leader's pass records hold A at risk once a pass after the
	// follower's start ran; the follower shows the same record.
	fleettest.WaitFor(t, "the leader's page lists A at risk", func() bool {
		_, _, doc := page(t, f.leader, "/")
		return rowOf(t, byID(doc, "at-risk"), f.a) != nil
	})

	t.Run("LeaderShowsTheReapWithItsEvidence", func(t *testing.T) {
		code, body, doc := page(t, f.leader, "/")
		if code != 200 {
			t.Fatalf("GET / = %d", code)
		}
		f.requireClean(t, "the leader's page", body)
		if byID(doc, "errors") != nil {
			t.Fatalf("the page shows an error block with both servers up:\n%s", body)
		}
		r := rowOf(t, byID(doc, "reaps"), f.r)
		if r == nil {
			t.Fatalf("the reaps table has no row for %s:\n%s", f.r, body)
		}
		// Evidence: runtime past 31m of a 30m max_runtime, idle past 21m
		// of an 11m stall timeout, generation 1, worker W-reaped.
		if r["reason"] != "stalled" || !strings.HasPrefix(r["runtime"], "31m") || !strings.HasPrefix(r["idle"], "21m") ||
			r["max_runtime"] != "30m0s" || r["stall timeout"] != "11m0s" || r["generation"] != "1" || r["worker"] != "W-reaped" ||
			!strings.HasSuffix(r["database time"], "Z") || r["type"] != "report.export" {
			t.Fatalf("the reap row of %s = %v", f.r, r)
		}
		a := rowOf(t, byID(doc, "at-risk"), f.a)
		if a["generation"] != "3" || a["worker"] != "W-risk" || !strings.HasPrefix(a["idle"], "6m") {
			t.Fatalf("the at-risk row of %s = %v", f.a, a)
		}
		for _, id := range []string{f.n, f.r} {
			if rowOf(t, byID(doc, "at-risk"), id) != nil {
				t.Fatalf("%s is listed at risk", id)
			}
		}
		if rowOf(t, byID(doc, "limits"), "report.export") == nil {
			t.Fatalf("the limits table has no row for report.export:\n%s", body)
		}
		if l := rows(byID(doc, "leases")); len(l) != 2 || !strings.Contains(l[1][1], "(this daemon)") || l[1][2] != "held" {
			t.Fatalf("the leases table = %v, want one row held by this daemon", l)
		}
	})

	t.Run("FollowerShowsTheLeadersPass", func(t *testing.T) {
		holder := f.db.Count(t, `SELECT count(*) FROM reaper_passes p JOIN leader_leases l USING (key) WHERE p.holder_id = l.holder_id`)
		if holder != 1 {
			t.Fatalf("%d pass records by the lease's holder, want 1", holder)
		}
		code, body, doc := page(t, f.follower, "/")
		if code != 200 {
			t.Fatalf("the follower's GET / = %d", code)
		}
		f.requireClean(t, "the follower's page", body)
		if f.follower.Leads() {
			t.Fatal("the follower leads")
		}
		if rowOf(t, byID(doc, "at-risk"), f.a) == nil || rowOf(t, byID(doc, "reaps"), f.r) == nil {
			t.Fatalf("the follower's page lacks the leader's at-risk job or the reap:\n%s", body)
		}
		if l := rows(byID(doc, "leases")); len(l) != 2 || strings.Contains(l[1][1], "(this daemon)") {
			t.Fatalf("the follower's leases table = %v, want the leader's row, not its own", l)
		}
	})

	t.Run("JobPageTellsTheStory", func(t *testing.T) {
		code, body, doc := page(t, f.leader, "/jobs/"+f.r)
		if code != 200 {
			t.Fatalf("GET /jobs/%s = %d", f.r, code)
		}
		f.requireClean(t, "the job page", body)
		story := text(byID(doc, "story"))
		for _, want := range []string{f.r, "FAILED", "stalled", "reaped"} {
			if !strings.Contains(story, want) {
				t.Fatalf("the story lacks %q:\n%s", want, story)
			}
		}
		if code, _, _ := page(t, f.leader, "/jobs/"+unique("J-none")); code != 404 {
			t.Fatalf("an unknown job's page = %d, want 404", code)
		}
	})

	t.Run("RendersInChromiumWithoutConsoleErrors", func(t *testing.T) {
		browserCheck(t, f.leader)
	})

	t.Run("RedisCutShowsTheErrorBlock", func(t *testing.T) {
		f.leader.Redis.Cut()
		defer f.leader.Redis.Restore()
		code, body, doc := page(t, f.leader, "/")
		if code != 200 {
			t.Fatalf("GET / with Redis cut = %d, want 200", code)
		}
		f.requireClean(t, "the page with Redis cut", body)
		errs := byID(doc, "errors")
		if errs == nil || !strings.Contains(text(errs), "Redis") {
			t.Fatalf("no error block naming Redis:\n%s", body)
		}
		// What PostgreSQL holds is still shown.
		if rowOf(t, byID(doc, "reaps"), f.r) == nil {
			t.Fatalf("the reaps are not shown with Redis cut:\n%s", body)
		}
	})

	t.Run("PostgreSQLCutShowsTheErrorBlock", func(t *testing.T) {
		f.leader.PG.Cut()
		defer f.leader.PG.Restore()
		code, body, doc := page(t, f.leader, "/")
		if code != 200 {
			t.Fatalf("GET / with PostgreSQL cut = %d, want 200", code)
		}
		f.requireClean(t, "the page with PostgreSQL cut", body)
		errs := byID(doc, "errors")
		if errs == nil || !strings.Contains(text(errs), "PostgreSQL") {
			t.Fatalf("no error block naming PostgreSQL:\n%s", body)
		}
		code, body, _ = page(t, f.leader, "/jobs/"+f.r)
		if code != 200 || !strings.Contains(body, `id="errors"`) {
			t.Fatalf("the job page with PostgreSQL cut = %d:\n%s", code, body)
		}
		f.requireClean(t, "the job page with PostgreSQL cut", body)
	})
}
