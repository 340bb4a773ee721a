//go:build !failpoints

package failpoint_test

import (
	"testing"

	"github.com/jobreaper/jobreaper/internal/failpoint"
)

// In a build without the failpoints tag, Inject ignores the variable:
// a point it names to panic does nothing.
func TestReleaseBuildIgnoresTheVariable(t *testing.T) {
	t.Setenv(failpoint.Env, "pass=panic;lease=stop")
	if failpoint.Enabled {
		t.Fatal("Enabled is true without the failpoints tag")
	}
	failpoint.Inject("pass")
	failpoint.Inject("lease")
}
