package main

import (
	"testing"

	"github.com/jobreaper/jobreaper/jobs/jobstest"
)

// A window below the interval is the daemon's mistake only: run --once
// runs with it (exit 0), the daemon still refuses it (exit 2).
func TestRunOnceDoesNotCheckTheMarkerWindowAgainstTheInterval(t *testing.T) {
	t.Parallel()
	db := jobstest.New(t)
	args := []string{"--database-url", db.URL, "--schema", db.Schema, "--redis-url", redisTestURL(),
		"--queues", unique("window"), "--interval", "10m", "--stall-timeout", "30m", "--marker-check-window", "1m", "--metrics-addr", "off"}
	once := run(t, append([]string{"run", "--once", "--output", "json"}, args...)...)
	requireExit(t, once, exitOK)
	requireOneJSONResult(t, once.stdout)

	daemon := run(t, append([]string{"run"}, args...)...)
	requireExit(t, daemon, exitCannotRun)
	requireOneLineError(t, daemon, "marker_check_window 1m0s is below interval 10m0s")
}
