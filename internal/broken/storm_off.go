//go:build !brokenstorm

package broken

// Storm is false: the mechanism is on (see the package doc).
const Storm = false
