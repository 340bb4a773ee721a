//go:build brokenhbretry

package broken

// HeartbeatRetry is true in a build with the brokenhbretry tag: the mechanism is off
// (see the package doc). Never in a release build.
const HeartbeatRetry = true
