//go:build brokenstorm

package broken

// Storm is true in a build with the brokenstorm tag: the mechanism is off
// (see the package doc). Never in a release build.
const Storm = true
