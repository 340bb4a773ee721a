// Package broken holds the switches of the deliberately broken builds of
// the fleet suite (cmd/jobreaper's TestReliabilityFleetBroken): each is a
// constant, false unless the binary is built with its test-only build tag,
// and turns one safety mechanism off, so that the suite can show that its
// targeted scenario fails without it. A release build has no such tag:
// every constant is false and the compiler drops the code it guards.
//
//	brokenfence    Fence: the reap transaction neither checks the leader
//	               lease before COMMIT nor bounds its idle time
//	brokengrace    Grace: the reaper counts idle time from updated_at
//	               even after a PostgreSQL outage (no outage grace)
//	brokenstorm    Storm: the reaper never starts a stall-storm hold
//	brokenhbretry  HeartbeatRetry: a failed heartbeat write uses up the
//	               attempt's interval, as a written one does (no retry
//	               after a backoff)
package broken
