package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/jobreaper/jobreaper/config"
	"github.com/jobreaper/jobreaper/internal/asynqstate"
	"github.com/jobreaper/jobreaper/internal/limits"
	"github.com/jobreaper/jobreaper/internal/pgstore"
	"github.com/jobreaper/jobreaper/internal/statuspage"
	"github.com/jobreaper/jobreaper/queue"
	"github.com/jobreaper/jobreaper/reaper"
)

// statusReaps is how many of the last reaps the page lists.
const statusReaps = 100

// statusSource gathers the status page from PostgreSQL and Redis for a
// daemon: the pass records its leaders wrote, the leader leases, the last
// reaps, the suggest-limits table (cached for an interval) and Redis's
// eviction policy.
type statusSource struct {
	app      *app
	cfg      config.Config
	store    *pgstore.Store
	rdb      redis.UniversalClient
	eviction *asynqstate.PolicyReader
	// holderID is this daemon's leader lease holder ID ("" without one);
	// key its queue set; settings what it compares with its leader's (nil
	// without a leader lease).
	holderID, key string
	settings      *reaper.Settings
	// secrets are the passwords of the URLs, never shown.
	secrets []string

	// The suggest-limits table, computed at most once per limitsEvery.
	limitsEvery time.Duration
	mu          sync.Mutex
	limits      *limits.Report
	limitsAt    time.Time
}

// newStatusSource returns the page's source over the daemon's pool and
// Redis client.
func newStatusSource(a *app, cfg config.Config, d *deps, mode runMode) *statusSource {
	s := &statusSource{app: a, cfg: cfg, rdb: d.rdb, eviction: asynqstate.NewPolicyReader(d.rdb, cfg.OpTimeout),
		store:    pgstore.New(d.pool, pgstore.WithSchema(cfg.Schema), pgstore.WithOpTimeout(cfg.OpTimeout)),
		holderID: d.leader.holder.ID, key: pgstore.LeaderLeaseKey(cfg.Queues), limitsEvery: cfg.Interval,
		secrets: urlPasswords(cfg.DatabaseURL, cfg.RedisURL)}
	if d.leader.on {
		if st, err := mode.settings(cfg); err == nil {
			s.settings = &st
		}
	}
	return s
}

// urlPasswords returns the passwords the URLs hold.
func urlPasswords(urls ...string) []string {
	var out []string
	for _, raw := range urls {
		if u, err := url.Parse(raw); err == nil && u.User != nil {
			if p, ok := u.User.Password(); ok && p != "" {
				out = append(out, p, url.QueryEscape(p), url.PathEscape(p))
			}
		}
	}
	return out
}

// clean folds err onto one line with every password hidden.
func (s *statusSource) clean(what string, err error) string {
	msg := what + ": " + oneLine(err.Error())
	for _, p := range s.secrets {
		msg = strings.ReplaceAll(msg, p, "xxxxx")
	}
	return msg
}

// Overview reads PostgreSQL and Redis side by side, so that one down
// does not use up the other's time.
func (s *statusSource) Overview(ctx context.Context) statuspage.Overview {
	var (
		o                 statuspage.Overview
		policy, warn, rEr string
		wg                sync.WaitGroup
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		policy, warn, rEr = s.readEviction(ctx)
	}()
	s.readPostgres(ctx, &o)
	wg.Wait()
	o.EvictionPolicy, o.EvictionWarning = policy, warn
	if rEr != "" {
		o.Errors = append(o.Errors, rEr)
	}
	return o
}

// readPostgres fills o from PostgreSQL; it stops at the first failure,
// which names what could not be read (the rest would fail alike).
func (s *statusSource) readPostgres(ctx context.Context, o *statuspage.Overview) {
	fail := func(what string, err error) {
		o.Errors = append(o.Errors, s.clean("PostgreSQL is unreachable or failing, "+what+" could not be read", err))
	}
	leases, err := s.store.LeaderLeaseDetails(ctx)
	if err != nil {
		fail("the leader leases", err)
		return
	}
	o.DBNow = leases.Now
	for _, l := range leases.Rows {
		o.Leases = append(o.Leases, statuspage.Lease{Key: l.Key, Holder: fmt.Sprintf("%s:%d", l.HolderHost, l.HolderPID),
			AcquiredAt: l.AcquiredAt, RenewedAt: l.RenewedAt, ExpiresAt: l.ExpiresAt,
			Live: leases.Now.Before(l.ExpiresAt), Mine: l.HolderID == s.holderID})
		if s.settings != nil && l.Key == s.key && l.HolderID != s.holderID && leases.Now.Before(l.ExpiresAt) {
			diffs, _, err := s.settings.Compare(l.Settings)
			if err != nil {
				o.Drift = append(o.Drift, "the leader's recorded settings are unreadable: "+err.Error())
			}
			for _, d := range diffs {
				o.Drift = append(o.Drift, d.String())
			}
		}
	}
	recs, err := s.store.PassRecords(ctx)
	if err != nil {
		fail("the pass records", err)
		return
	}
	for _, r := range recs {
		p, err := statuspage.DecodePass(r)
		if err != nil {
			o.Errors = append(o.Errors, err.Error())
		}
		o.Passes = append(o.Passes, p)
	}
	reaps, err := s.store.RecentReaps(ctx, statusReaps)
	if err != nil {
		fail("the last reaps", err)
		return
	}
	for _, r := range reaps {
		o.Reaps = append(o.Reaps, statuspage.DecodeReap(r))
	}
	rep, at, err := s.limitsTable(ctx)
	o.Limits, o.LimitsAt = rep, at
	if err != nil {
		fail("the suggest-limits table", err)
	}
}

// limitsTable returns the suggest-limits table over the default window,
// computed again only when the cached one is an interval old. A failure
// keeps the cached table, returned with the error.
func (s *statusSource) limitsTable(ctx context.Context) (*limits.Report, time.Time, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.limits != nil && time.Since(s.limitsAt) < s.limitsEvery {
		return s.limits, s.limitsAt, nil
	}
	window, _ := parseAge(suggestWindowDefault)
	rep, err := suggestLimits(ctx, s.store, s.cfg, window, "")
	if err != nil {
		return s.limits, s.limitsAt, err
	}
	s.limits, s.limitsAt = &rep, time.Now()
	return s.limits, s.limitsAt, nil
}

// readEviction reads Redis's eviction policy: the policy, a warning when
// markers may be evicted, and an error line when Redis could not be read.
func (s *statusSource) readEviction(ctx context.Context) (policy, warning, errLine string) {
	policy, err := s.eviction.EvictionPolicy(ctx)
	switch {
	case errors.Is(err, asynqstate.ErrConfigRefused):
		return "", "Redis refuses CONFIG GET (common on managed Redis), so its eviction policy cannot be checked: make sure maxmemory-policy is noeviction, " +
			"or markers may be evicted under memory pressure (the FAILED rows still guard, and passes restore lost markers).", ""
	case err != nil:
		return "", "", s.clean("Redis is unreachable or failing, its eviction policy could not be read", err)
	case policy != asynqstate.EvictionPolicySafe:
		return policy, "Redis's maxmemory-policy is " + policy + ", not noeviction: under memory pressure Redis may evict markers and asynq's own keys; " +
			"the FAILED rows still refuse reaped tasks and passes restore lost markers, but set maxmemory-policy noeviction.", ""
	}
	return policy, "", ""
}

// Job tells job id's story as `jobreaper inspect` prints it.
func (s *statusSource) Job(ctx context.Context, id string) (string, error) {
	markers, err := queue.NewMarkerStore(s.rdb, queue.WithMarkerOpTimeout(s.cfg.OpTimeout))
	if err != nil {
		return "", errors.New(s.clean("reading markers", err))
	}
	d := &opsDeps{store: s.store, rdb: s.rdb, markers: markers}
	doc, err := s.app.inspect(ctx, d, s.cfg, id, nil)
	var ee *exitError
	if errors.As(err, &ee) && ee.code == exitPassErrors {
		return "", fmt.Errorf("%w: %s", statuspage.ErrNotFound, s.clean("job "+id, ee.err))
	}
	if err != nil {
		return "", errors.New(s.clean("reading job "+id, err))
	}
	var b bytes.Buffer
	if err := printInspect(&b, doc); err != nil {
		return "", err
	}
	return b.String(), nil
}

// startStatusPage listens on status_addr before returning (a port in use
// is an exit-2 error at start) and serves the page in the background; a
// nil-safe server when status_addr is off.
func (a *app) startStatusPage(ctx context.Context, cfg config.Config, d *deps, mode runMode, log *slog.Logger) (*metricsServer, error) {
	if cfg.StatusAddr == config.StatusAddrOff {
		return &metricsServer{}, nil
	}
	plog := log.With("component", "status_page")
	ln, err := (&net.ListenConfig{}).Listen(ctx, "tcp", cfg.StatusAddr)
	if err != nil {
		return nil, cannotRun("cannot listen on status_addr %s: %v; choose a free --status-addr or set it to \"off\"", cfg.StatusAddr, err)
	}
	s := &metricsServer{
		srv: &http.Server{
			Handler:           statuspage.New(newStatusSource(a, cfg, d, mode), cfg.OpTimeout, plog),
			ReadHeaderTimeout: 5 * time.Second,
			WriteTimeout:      cfg.OpTimeout + 5*time.Second,
			ErrorLog:          slog.NewLogLogger(plog.Handler(), slog.LevelWarn),
		},
		failed: make(chan error, 1),
	}
	go func() {
		if err := s.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.failed <- err
		}
	}()
	plog.Info("serving the status page", "addr", ln.Addr().String())
	return s, nil
}
