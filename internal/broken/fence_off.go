//go:build !brokenfence

package broken

// Fence is false: the mechanism is on (see the package doc).
const Fence = false
