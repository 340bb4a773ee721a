package statuspage

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/jobreaper/jobreaper/internal/limits"
)

type fakeSource struct {
	o     Overview
	story string
	err   error
	// deadline records whether Overview's ctx had a deadline.
	deadline bool
}

func (f *fakeSource) Overview(ctx context.Context) Overview {
	_, f.deadline = ctx.Deadline()
	return f.o
}

func (f *fakeSource) Job(context.Context, string) (string, error) { return f.story, f.err }

func get(t *testing.T, h http.Handler, path string) (int, http.Header, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
	body, _ := io.ReadAll(rec.Result().Body)
	return rec.Code, rec.Result().Header, string(body)
}

func TestPage(t *testing.T) {
	t.Parallel()
	p99 := 990.1
	now := time.Date(2026, 12, 2, 1, 0, 0, 0, time.UTC)
	src := &fakeSource{o: Overview{
		DBNow: now,
		Passes: []Pass{{Key: `["q"]`, HolderHost: "host", At: now.Add(-time.Second), Summary: Summary{Scanned: 3, StaleQueued: 2, BrokenActive: 1},
			AtRisk: []Decision{{JobID: "J<risk>", IdleSeconds: 360, StallTimeoutSeconds: 660}}}},
		Reaps:  []Reap{{JobID: "J1", Reason: "stalled", RuntimeSeconds: 1860, DBNow: now}},
		Limits: &limits.Report{WindowSeconds: 604800, Types: []limits.TypeReport{{Type: "enc", RuntimeSeconds: limits.Quantiles{P99: &p99}}}},
		Drift:  []string{"interval: this replica 1s, the leader 2s"}, EvictionPolicy: "allkeys-lru", EvictionWarning: "not noeviction",
	}}
	h := New(src, time.Second, slog.New(slog.DiscardHandler))

	code, hdr, body := get(t, h, "/")
	if code != 200 || !src.deadline || !strings.HasPrefix(hdr.Get("Content-Type"), "text/html") ||
		!strings.Contains(hdr.Get("Content-Security-Policy"), "default-src 'none'") {
		t.Fatalf("GET / = %d, %v, deadline %v", code, hdr, src.deadline)
	}
	for _, want := range []string{"J&lt;risk&gt;", `href="/jobs/J1"`, "31m0s", "16m30s", "2 QUEUED job(s)", "1 broken", "interval: this replica 1s", "not noeviction"} {
		if !strings.Contains(body, want) {
			t.Errorf("the page lacks %q", want)
		}
	}
	if strings.Contains(body, "<script") || strings.Contains(body, `id="errors"`) {
		t.Fatal("the page holds a script or an error block")
	}

	src.o = Overview{Errors: []string{"PostgreSQL is unreachable or failing: dial tcp: connection refused"}}
	if code, _, body = get(t, h, "/"); code != 200 || !strings.Contains(body, `id="errors"`) || !strings.Contains(body, "connection refused") {
		t.Fatalf("GET / with an error = %d:\n%s", code, body)
	}

	src.story = "job J1\nstatus FAILED"
	if code, _, body = get(t, h, "/jobs/J1"); code != 200 || !strings.Contains(body, "status FAILED") {
		t.Fatalf("GET /jobs/J1 = %d:\n%s", code, body)
	}
	src.err = fmt.Errorf("%w: job J9 not found", ErrNotFound)
	if code, _, _ = get(t, h, "/jobs/J9"); code != 404 {
		t.Fatalf("GET /jobs/J9 = %d, want 404", code)
	}
	src.err = errors.New("reading job J1: timeout")
	if code, _, body = get(t, h, "/jobs/J1"); code != 200 || !strings.Contains(body, `id="errors"`) {
		t.Fatalf("GET /jobs/J1 failing = %d, want 200 with the error block", code)
	}
	if code, _, _ = get(t, h, "/other"); code != 404 {
		t.Fatalf("GET /other = %d, want 404", code)
	}
}
