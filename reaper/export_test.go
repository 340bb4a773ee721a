package reaper

import "time"

// SetLeaderLeaseClock makes l read the time of its drift log's repetition
// from now.
func SetLeaderLeaseClock(l *LeaderLease, now func() time.Time) { l.now = now }

// DriftLogRepeat exposes how often a lasting settings drift is logged.
const DriftLogRepeat = driftLogRepeat
