package reaper

import "github.com/jobreaper/jobreaper/internal/pgstore"

// UncoveredQueues exposes uncoveredQueues, the uncovered-queue check's
// comparison.
func UncoveredQueues(known []string, ls pgstore.LeaderLeases, own ...string) []string {
	return uncoveredQueues(known, ls, own)
}

// ChecksUncovered exposes checksUncovered: whether the holder of key makes
// the uncovered-queue check.
var ChecksUncovered = checksUncovered
