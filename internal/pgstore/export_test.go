package pgstore

// SetBeforeReapCommit makes s call f in each of its reap transactions
// after the leader lease check, just before COMMIT: where a leader paused
// by the operating system or the runtime would stop.
func SetBeforeReapCommit(s *Store, f func()) { s.beforeReapCommit = f }

// LeaderIdleBoundSQL exposes the reap transaction's idle bound statement.
const LeaderIdleBoundSQL = leaderIdleBoundSQL

// The statements whose plans TestPlansHoldOnStaleStatistics checks.
const (
	LoadSQL           = loadSQL
	ReapBatchSQL      = reapBatchSQL
	ReapLockSQL       = reapLockSQL
	MarkersSetSQL     = markersSetSQL
	MarkersFailedSQL  = markersFailedSQL
	LostCandidatesSQL = lostCandidatesSQL
	FailRetrySQL      = failRetrySQL
	RetryPendingSQL   = retryPendingSQL
)

// RequeueSQL is the operator's requeue, whose plan
// TestOperatorPlansHoldOnStaleStatistics checks.
const RequeueSQL = requeueSQL

// Args exposes the stall rule's named arguments.
func (r StallRule) Args() map[string]any { return r.args() }

// Q exposes the Store's Core.Q: sql with {schema} rendered as the Store's
// schema.
func (s *Store) Q(sql string) string { return s.core.Q(sql) }

// The reconciliation's statements whose plans TestReconcilePlansUseTheirIndexes checks.
const (
	ReapedSQL           = reapedSQL
	ReapedCountSQL      = reapedCountSQL
	StaleQueuedSQL      = staleQueuedSQL
	ProcessingQueuesSQL = processingQueuesSQL
	NoQueueSQL          = noQueueSQL
)

// StalledByQueueSQL exposes the uncovered-queue check's count, whose plan
// TestUncoveredCountPlanUsesTheProcessingIndex checks.
const StalledByQueueSQL = stalledByQueueSQL

// Pending exposes whether w saw connection-level failures that no
// PassClock recorded yet.
func (w *ConnWatch) Pending() bool {
	_, _, ok := w.pending()
	return ok
}

// WindowStatsSQL is suggest-limits' statement, whose plan
// TestWindowStatsReadsEventsByKindAndTime checks.
const WindowStatsSQL = windowStatsSQL
