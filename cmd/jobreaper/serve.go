package main

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/jobreaper/jobreaper/config"
)

// metricsShutdownTimeout bounds the wait for scrapes in flight when the
// daemon stops; a scrape takes milliseconds, and the orchestrator's own
// grace period (Kubernetes: 30 s) must leave room for the reaper's stop.
const metricsShutdownTimeout = 5 * time.Second

// metricsServer serves /metrics, /healthz and /readyz. A nil *metricsServer (when
// metrics_addr is "off") is valid: stop does nothing and failed never fires.
type metricsServer struct {
	srv    *http.Server
	failed chan error
}

// startMetricsServer listens on addr before returning, so that a port in
// use is an exit-2 error at start, and serves in the background. reg gets
// the Go runtime and process collectors besides the reaper's metrics.
// ready answers /readyz and /healthz.
func startMetricsServer(ctx context.Context, addr string, reg *prometheus.Registry, ready *readiness, log *slog.Logger) (*metricsServer, error) {
	if addr == config.MetricsAddrOff {
		return &metricsServer{}, nil
	}
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	// /healthz says the process is up and running its passes; whether
	// passes succeed is for jobreaper_last_success_timestamp_seconds and
	// its alert, since restarting the daemon does not fix an unreachable
	// database. It answers 503 once the daemon gave up (ready.fail).
	mux.HandleFunc("GET /healthz", ready.serveHealthz)
	// /readyz says whether this replica's last PostgreSQL and Redis checks
	// succeeded: a load balancer or an operator's probe reads it; a
	// follower of the leader lease is ready.
	mux.Handle("GET /readyz", ready)
	ln, err := (&net.ListenConfig{}).Listen(ctx, "tcp", addr)
	if err != nil {
		return nil, cannotRun("cannot listen on metrics_addr %s: %v; choose a free --metrics-addr or set it to \"off\"", addr, err)
	}
	s := &metricsServer{
		srv: &http.Server{
			Handler:           mux,
			ReadHeaderTimeout: 5 * time.Second,
			ErrorLog:          slog.NewLogLogger(log.With("component", "metrics").Handler(), slog.LevelWarn),
		},
		failed: make(chan error, 1),
	}
	go func() {
		if err := s.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.failed <- err
		}
	}()
	log.With("component", "metrics").Info("serving /metrics and /healthz", "addr", ln.Addr().String(), "readyz", "/readyz")
	return s, nil
}

// stop shuts the server down, letting scrapes in flight finish within
// metricsShutdownTimeout. ctx is usually already cancelled; its values are
// kept, its cancellation is not.
func (s *metricsServer) stop(ctx context.Context, log *slog.Logger) {
	if s == nil || s.srv == nil {
		return
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), metricsShutdownTimeout)
	defer cancel()
	if err := s.srv.Shutdown(sctx); err != nil {
		log.Warn("metrics server did not stop cleanly", "err", err)
	}
}
