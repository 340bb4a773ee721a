//go:build !brokengrace

package broken

// Grace is false: the mechanism is on (see the package doc).
const Grace = false
