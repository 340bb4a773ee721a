//go:build !brokenhbretry

package broken

// HeartbeatRetry is false: the mechanism is on (see the package doc).
const HeartbeatRetry = false
