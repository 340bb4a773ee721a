//go:build brokenfence

package broken

// Fence is true in a build with the brokenfence tag: the mechanism is off
// (see the package doc). Never in a release build.
const Fence = true
