package pgstore_test

import (
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	// Every pool a test opens (jobstest.New, jobs.Connect) is closed by its
	// t.Cleanup, and pgxpool's health checker stops with its pool, so no
	// goroutine may outlive the tests.
	goleak.VerifyTestMain(m)
}
