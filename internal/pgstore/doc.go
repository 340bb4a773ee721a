// Package pgstore holds the daemon's and the operator commands'
// statements on jobreaper's tables: loading the rows of active tasks,
// the set-based reap (a compare-and-set that re-checks the stall rule in
// SQL on the database clock), the lost-task search, markers, the leader
// lease, stall-storm holds, outages (the pass's clock and the ConnWatch
// tracer), the uncovered-queue check, stale QUEUED rows, inspect, requeue,
// cancel and prune. It runs them over a pgcore.Core, the machinery it
// shares with the worker library (package jobs), and is internal: only the
// daemon (package reaper) and the command (cmd/jobreaper) use it.
package pgstore
