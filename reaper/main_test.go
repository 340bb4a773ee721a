package reaper_test

import (
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	// Every pool, client and miniredis a test opens is closed by its
	// t.Cleanup, so no goroutine may outlive the tests.
	goleak.VerifyTestMain(m)
}
