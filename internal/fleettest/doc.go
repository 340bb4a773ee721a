// Package fleettest runs the real processes of a jobreaper deployment for
// the multi-process tests: daemons (the jobreaper binary) and workers (a
// small asynq worker program with the start guard), each talking to
// PostgreSQL and Redis through a relay of its own that the test can cut
// and restore, so that one process loses a server while the others keep
// it, without touching the shared servers.
//
// The pieces, each usable alone:
//
//   - Relay (relay.go): a TCP relay from a loopback port to a server, cut
//     and restored on the same address. RelayURL rewrites a PostgreSQL or
//     Redis URL to go through a new one.
//   - BuildJobreaper, BuildJobreaperRelease, BuildWorker (build.go): the
//     binaries, built into the test's temporary directory. BuildJobreaper
//     builds with the failpoints tag, so a test can make one daemon panic
//     or pause at a named point (package internal/failpoint); the release
//     build ignores JOBREAPER_FAILPOINTS.
//   - Daemon (daemon.go): `jobreaper run` started with its own relays and
//     a metrics server on a free port; its log captured; /metrics,
//     /readyz and /healthz scraped; signalled; its exit code waited for.
//   - Worker (worker.go): the worker program of package
//     internal/fleettest/worker, with its own relays, serving one queue
//     or several; it says what its handlers do on stdout, one line each,
//     which the test awaits, and takes commands on stdin (Tell: a
//     heartbeating job hangs or finishes, a waiting handler goes on).
//     Its job kinds (complete, hang, heartbeat, fail, error, nil,
//     completed, late) cover a live job, a stalled one and each outcome a
//     handler can return; its doc comment lists them.
//   - Metric, Probe (probe.go): one scrape or probe of any metrics
//     address, also for a daemon the test runs in-process.
//   - InstallHistory, ReadHistory (history.go): a test-only trigger on
//     the test's schema logging every change of a job's updated_at,
//     generation and status, and every leader lease version, at the
//     database time of its COMMIT; read back with the reaped events and
//     the charges.
//   - Check (check.go): the fleet suite's invariants over a recorded
//     History, a pure function (no false reap, one leader at each reap,
//     at most one terminal transition and charge, markers, stall bounds).
//   - Schedule (schedule.go): a seeded fault schedule; the same seed
//     replays it.
//   - BuildJobreaperBroken, BuildWorkerBroken (build.go): copies built
//     with one test-only tag of package internal/broken, a safety
//     mechanism off.
//
// Every wait polls with a deadline (Deadline, 10x what a slow shared CI
// machine needs); every process is killed at the test's cleanup, and its
// log is shown when the test failed. The scenarios (outages, storms,
// finalization blips in cmd/jobreaper's blip tests) add their steps on
// top of these pieces instead of copying them.
package fleettest

import "time"

// Deadline bounds every wait of the harness: it polls, and a slow CI
// machine (two cores shared, -race in the parent) gets plenty of room.
const Deadline = 90 * time.Second

// pollEvery is how often the waits poll.
const pollEvery = 50 * time.Millisecond
