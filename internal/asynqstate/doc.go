// Package asynqstate holds the daemon's and the operator commands' side of
// asynq's Redis: the listers of active tasks (IDLister, InspectorLister)
// the reaper's scan reads, the status readers of the lost-task search and
// the stale QUEUED report, the canceller of running handlers, the
// requeuer, the reader of Redis's eviction policy, the marker writes
// (MarkerWriter, a compare-and-set that only ever moves a marker forward)
// and RedisID, which names the Redis a URL reads. It is internal: only the
// daemon (package reaper) and the command (cmd/jobreaper) use it; a worker
// and a producer use package queue, whose guard reads the markers written
// here.
package asynqstate
