package broken_test

import (
	"testing"

	"github.com/jobreaper/jobreaper/internal/broken"
)

// A build without the test-only tags (every release build, and plain go
// test) has every safety mechanism on.
func TestEveryMechanismIsOnWithoutItsTag(t *testing.T) {
	for name, off := range map[string]bool{"Fence": broken.Fence, "Grace": broken.Grace, "Storm": broken.Storm,
		"HeartbeatRetry": broken.HeartbeatRetry} {
		if off {
			t.Errorf("broken.%s is true in a build without its tag", name)
		}
	}
}
