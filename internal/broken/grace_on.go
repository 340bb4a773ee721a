//go:build brokengrace

package broken

// Grace is true in a build with the brokengrace tag: the mechanism is off
// (see the package doc). Never in a release build.
const Grace = true
