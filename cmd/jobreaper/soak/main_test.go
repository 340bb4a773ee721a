// Package soak holds TestReliabilitySoak, the soak of the reliability
// suites: the jobreaper binary as a daemon against a fleet of worker
// processes under a stream of jobs. It is a package of its own so that its
// minutes run beside the other packages' tests, not inside the time limit
// of cmd/jobreaper's.
package soak

import (
	"os"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	// The soak is no outage scenario: the daemon it runs gets the outage
	// grace off (see cmd/jobreaper's TestMain), so that a connection the
	// load refuses never holds its hung jobs for a stall timeout.
	if err := os.Setenv("JOBREAPER_OUTAGE_GRACE", "false"); err != nil {
		panic(err)
	}
	// The RSS sampler and the daemon's log reader end before the test
	// does; the worker processes close their pools, clients and server.
	goleak.VerifyTestMain(m)
}
