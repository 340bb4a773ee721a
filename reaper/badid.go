package reaper

import (
	"strings"

	"github.com/jobreaper/jobreaper/internal/idcheck"
	"github.com/jobreaper/jobreaper/jobs"
)

// SkipBadJobID: an active task whose ID cannot be a job ID (jobs.CheckID: a
// NUL byte, invalid UTF-8, longer than jobs.MaxIDLength), as another
// producer sharing the Redis may enqueue. No row can hold such an ID, and
// sending it to PostgreSQL would fail the whole statement it is part of, so
// it is counted and left out before any load.
const SkipBadJobID SkipReason = "bad_job_id"

// badIDsShown bounds how many refused IDs one log line shows.
const badIDsShown = 5

// splitBadIDs returns ids without those jobs.CheckID refuses (kept) and
// the refused ones (bad). ids is not modified.
func splitBadIDs(ids []string) (kept, bad []string) {
	kept = make([]string, 0, len(ids))
	for _, id := range ids {
		if jobs.CheckID(id) != nil {
			bad = append(bad, id)
			continue
		}
		kept = append(kept, id)
	}
	return kept, bad
}

// warnBadIDs logs the active tasks of queue whose IDs jobs.CheckID refused
// in one warning, escaped (%q) so that a NUL byte or invalid UTF-8 stays
// readable; they were counted as SkipBadJobID as they were listed.
func (r *Reaper) warnBadIDs(queue string, bad []string) {
	if len(bad) == 0 {
		return
	}
	shown := make([]string, 0, min(len(bad), badIDsShown))
	for _, id := range bad[:min(len(bad), badIDsShown)] {
		shown = append(shown, idcheck.QuoteID(id))
	}
	r.log.Warn("active tasks skipped: their IDs cannot be job IDs (NUL byte, invalid UTF-8 or over the length limit); another producer shares this Redis?",
		"queue", queue, "reason", SkipBadJobID, "count", len(bad), "job_ids", strings.Join(shown, " "))
}
