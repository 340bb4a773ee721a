//go:build !failpoints

package failpoint

// Enabled is false in a release build: Inject does nothing.
const Enabled = false

// Inject does nothing in a release build (built without the failpoints
// tag); in a failpoints build it takes the action JOBREAPER_FAILPOINTS
// names for the point name, if any.
func Inject(string) {}
