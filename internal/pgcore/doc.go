// Package pgcore is what the worker library (package jobs) and the
// daemon's and operator commands' statements (internal/pgstore) share on
// the PostgreSQL side: a Core that runs statements against one schema, each
// with its own timeout and its errors named after the operation; the
// transactions of jobreaper's writes; the job row as read (Snapshot,
// Limits) and the conversions of PostgreSQL intervals; the per-type
// cascades that run inside the transaction that changes a job, which a
// worker's Fail and a reap share; the classifiers of transient and
// connection-level failures; and the plan pinning of statements that name
// jobs by an array of IDs.
//
// It is internal: a worker author sees only package jobs, whose Store wraps
// a Core, and the daemon's store (internal/pgstore) wraps another.
package pgcore
