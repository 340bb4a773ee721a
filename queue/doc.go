// Package queue is the asynq side of jobreaper's worker library, for the
// workers and producers that run jobs on asynq queues: the start guard
// middleware that refuses a task whose job was reaped or is terminal and
// otherwise claims it, hands the handler its lease and maps the handler's
// result onto the job row (Guard, Failure, IsFailure); the marker reader
// the guard consults (MarkerStore: a marker is the reaper's record of a
// reap in Redis); the enqueue helper that gives a task its job's ID, queue
// and hard timeout (Enqueue, Enqueuer); and the Redis client of the three
// topologies (NewRedisClient).
//
// The job row in PostgreSQL is the truth; Redis only holds tasks and
// markers. Every path here fails closed: when the row or the marker cannot
// be read, a task waits, it never starts a reaped job.
//
// The daemon's side of Redis (listers, status readers, marker writes) is
// internal to jobreaper.
package queue
