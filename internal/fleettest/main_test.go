package fleettest_test

import (
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	// Every relay, process and reader a test starts ends at its cleanup.
	goleak.VerifyTestMain(m)
}
