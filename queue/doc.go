// Package queue is jobreaper's asynq side: the marker store that records a
// reap in Redis, the active-task lister the reaper's scan uses, the start
// guard middleware that refuses a task whose job was reaped or is terminal
// and otherwise claims it, and the enqueue helper that gives a task its
// job's ID, queue and hard timeout.
//
// The job row in PostgreSQL is the truth; Redis only holds tasks and
// markers. Every path here fails closed: when the row or the marker cannot
// be read, a task waits, it never starts a reaped job.
package queue
