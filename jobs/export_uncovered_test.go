package jobs

// StalledByQueueSQL exposes the uncovered-queue check's count, whose plan
// TestUncoveredCountPlanUsesTheProcessingIndex checks.
const StalledByQueueSQL = stalledByQueueSQL
