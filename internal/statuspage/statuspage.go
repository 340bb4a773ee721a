// Package statuspage serves jobreaper's read-only status page: at / the
// last reaps with their evidence, the jobs at risk and the last pass's
// candidates, the suggest-limits table, the leader lease of each queue
// set, settings drift, the last pass's summary and Redis's eviction
// policy; at /jobs/<id> one job's story, as `jobreaper inspect` tells it.
// It is server-rendered html/template with no script, shows no payload
// and no secret, and answers within its timeout: what could not be read
// (PostgreSQL or Redis down) is an error block on a page served with
// status 200, never a 500. What it shows comes from a Source.
package statuspage

import (
	"bytes"
	"context"
	"embed"
	"errors"
	"html/template"
	"log/slog"
	"net/http"
	"strings"
	"time"
)

// ErrNotFound is what Source.Job returns for a job that does not exist.
var ErrNotFound = errors.New("no such job")

// Source gathers what the page shows. Both methods return within ctx's
// deadline.
type Source interface {
	// Overview gathers the page at /; it never fails as a whole: what it
	// could not read is named in Overview.Errors.
	Overview(ctx context.Context) Overview
	// Job returns job id's story as plain text; ErrNotFound (wrapped) for
	// an unknown or impossible ID, any other error when it could not be
	// read.
	Job(ctx context.Context, id string) (string, error)
}

//go:embed page.html.tmpl
var files embed.FS

var page = template.Must(template.New("page.html.tmpl").Funcs(template.FuncMap{
	"secs": secs,
	"when": func(t time.Time) string {
		if t.IsZero() {
			return "-"
		}
		return t.UTC().Format("2006-01-02 15:04:05Z")
	},
	"optsecs": func(p *float64) string {
		if p == nil {
			return "-"
		}
		return secs(*p)
	},
	"ago": func(now, t time.Time) string {
		if now.IsZero() || t.IsZero() {
			return ""
		}
		return secs(now.Sub(t).Seconds()) + " ago"
	},
}).ParseFS(files, "page.html.tmpl"))

// secs writes seconds as a short duration: 16m30s, 962ms.
func secs(s float64) string {
	d := time.Duration(s * float64(time.Second))
	if d >= time.Second || d <= -time.Second {
		return d.Round(time.Second).String()
	}
	return d.Round(time.Millisecond).String()
}

// Handler serves the page; timeout bounds each request's gathering (the
// daemon's op_timeout, so a page answers within it).
type Handler struct {
	src     Source
	timeout time.Duration
	log     *slog.Logger
	mux     *http.ServeMux
}

// New returns the page's handler over src. timeout is positive.
func New(src Source, timeout time.Duration, log *slog.Logger) *Handler {
	h := &Handler{src: src, timeout: timeout, log: log, mux: http.NewServeMux()}
	h.mux.HandleFunc("GET /{$}", h.overview)
	h.mux.HandleFunc("GET /jobs/{id}", h.job)
	return h
}

// ServeHTTP serves / and /jobs/<id>; any other path is 404.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) { h.mux.ServeHTTP(w, r) }

// data is what the template renders: the overview, or one job.
type data struct {
	Overview *Overview
	JobID    string
	Story    string
	Errors   []string
	Now      time.Time
}

// gatherBudget is the share of the timeout the gathering may take; the
// rest is for rendering and writing, so the answer lands within timeout.
const gatherBudget = 0.9

func (h *Handler) ctx(r *http.Request) (context.Context, context.CancelFunc) {
	return context.WithTimeout(r.Context(), time.Duration(gatherBudget*float64(h.timeout)))
}

func (h *Handler) overview(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := h.ctx(r)
	defer cancel()
	o := h.src.Overview(ctx)
	h.render(w, http.StatusOK, data{Overview: &o, Errors: o.Errors, Now: o.DBNow})
}

func (h *Handler) job(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := h.ctx(r)
	defer cancel()
	id := r.PathValue("id")
	story, err := h.src.Job(ctx, id)
	switch {
	case errors.Is(err, ErrNotFound):
		h.render(w, http.StatusNotFound, data{JobID: id, Errors: []string{oneLine(err.Error())}})
	case err != nil:
		h.render(w, http.StatusOK, data{JobID: id, Errors: []string{oneLine(err.Error())}})
	default:
		h.render(w, http.StatusOK, data{JobID: id, Story: story})
	}
}

// render writes the page whole or, if the template fails (a bug), a
// plain error line; never a stack.
func (h *Handler) render(w http.ResponseWriter, status int, d data) {
	var b bytes.Buffer
	if err := page.Execute(&b, d); err != nil {
		h.log.Error("rendering the status page failed", "component", "status_page", "err", err)
		http.Error(w, "the status page could not be rendered; see the daemon's log", http.StatusInternalServerError)
		return
	}
	hd := w.Header()
	hd.Set("Content-Type", "text/html; charset=utf-8")
	hd.Set("Cache-Control", "no-store")
	hd.Set("X-Content-Type-Options", "nosniff")
	// No script runs on this page, and nothing loads from elsewhere.
	hd.Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'; img-src data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
	w.WriteHeader(status)
	_, _ = w.Write(b.Bytes())
}

// oneLine folds an error onto one line.
func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }
