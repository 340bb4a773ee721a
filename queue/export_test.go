package queue

// NewGuardForTest returns NewGuard(store, markers, opts...) that reads the
// task ID from the context Deliver builds: tests of package queue_test (the
// race suite, which also imports package reaper) cannot build the handler
// context of an asynq.Server.
func NewGuardForTest(store GuardStore, markers MarkerReader, opts ...GuardOption) *Guard {
	g := NewGuard(store, markers, opts...)
	g.taskID = testTaskID
	return g
}

// Deliver runs jobID's task through the middleware of a guard from
// NewGuardForTest into h, as a worker's asynq.Server would.
var Deliver = deliver
