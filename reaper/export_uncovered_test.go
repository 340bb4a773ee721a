package reaper

import "github.com/jobreaper/jobreaper/jobs"

// UncoveredQueues exposes uncoveredQueues, the uncovered-queue check's
// comparison.
func UncoveredQueues(known []string, ls jobs.LeaderLeases, own ...string) []string {
	return uncoveredQueues(known, ls, own)
}

// ChecksUncovered exposes checksUncovered: whether the holder of key makes
// the uncovered-queue check.
var ChecksUncovered = checksUncovered
