// Package reaper is jobreaper's scan: one pass lists the active asynq tasks
// of the configured queues, loads their job rows and type limits in batched
// queries, decides per job with the pure function Decide, and, once every
// task is judged, reaps the stalled jobs with a compare-and-set in
// PostgreSQL (unless a stall-storm hold holds their queues, or they are
// too many at once: StormCheck) and sets the Redis marker that keeps the
// start guard from running a reaped job again.
//
// The package depends on jobs (PostgreSQL) and queue (asynq, markers);
// neither depends on it.
package reaper
