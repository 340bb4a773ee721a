// Package jobs is the PostgreSQL side of jobreaper: the schema and its
// migrations, the claim that starts an attempt, the batched read the reaper
// decides on, and the reap, a compare-and-set that re-checks the stall rule
// in SQL on the database clock.
//
// Every write that belongs to an attempt is fenced by the attempt's
// generation: its WHERE names status PROCESSING and the generation the claim
// returned, so a superseded or reaped attempt changes 0 rows.
//
// The package imports neither queue nor reaper; both depend on it.
package jobs
