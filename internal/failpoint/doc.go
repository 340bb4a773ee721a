// Package failpoint marks the places where the multi-process tests make a
// daemon misbehave on purpose: panic in a pass, sleep in a leader lease
// attempt, stop between a reap's leader lease check and its COMMIT.
//
// A release build compiles Inject to an empty function: no variable is
// read, nothing can be triggered from outside, and the call costs nothing.
// Only a build with the failpoints tag (go build -tags failpoints, as the
// test harness builds the binary) reads the environment variable
// JOBREAPER_FAILPOINTS, a list of name=action separated by semicolons:
//
//	JOBREAPER_FAILPOINTS="pass=panic;reap-before-commit=stop"
//
// Actions, taken each time the point is reached; each first writes the
// line "failpoint <name> reached (<action>)" to stderr, so a test can wait
// for it:
//
//	panic           panic with a message naming the point
//	sleep:<d>       sleep for the Go duration d (ignoring any context)
//	stop            SIGSTOP the whole process, before the goroutine that
//	                reached the point goes any further; the test sends
//	                SIGCONT
//
// Points (the names the code injects): "pass" at the start of every pass,
// "lease" at the start of every leader lease attempt, and
// "reap-before-commit" between a reap transaction's leader lease check and
// its COMMIT.
package failpoint

// Env is the environment variable a failpoints build reads.
const Env = "JOBREAPER_FAILPOINTS"
