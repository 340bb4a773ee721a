// Command jobreaper recovers stalled jobs: it fails PROCESSING jobs whose
// asynq task stopped making progress, so that their parents and users stop
// waiting, and marks them so that a late result cannot undo the failure.
//
// Usage:
//
//	jobreaper migrate          create or update jobreaper's tables
//	jobreaper run              run the reaper daemon and its metrics server
//	jobreaper run --once       run one pass and print what it did
//	jobreaper inspect ID       print one job's whole story
//	jobreaper cancel --reason TEXT ID...
//	                           fail QUEUED or PROCESSING jobs as cancelled
//	jobreaper prune --older-than 30d
//	                           delete old jobs' events and batch records
//	jobreaper demo             show a hung job reaped and its late result refused
//	jobreaper version          print the version and VCS revision
//
// Exit codes: 0 a clean pass (or a clean shutdown), 1 a pass with errors
// or one that panicked (the log names them), 2 could not run (bad flags or
// config, PostgreSQL or Redis unreachable), 3 the daemon stopped after
// three passes in a row panicked (its leader lease released), to be
// restarted by its supervisor.
// Run jobreaper --help for every flag.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	// SIGTERM (Kubernetes, systemd) and SIGINT (Ctrl-C) cancel ctx; each
	// command stops what it started in its own commented order.
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	code := execute(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
