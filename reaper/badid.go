package reaper

import (
	"strings"

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

// dropBadIDs returns ids without those jobs.CheckID refuses. The refused
// ones are counted as SkipBadJobID and logged in one warning for queue,
// escaped (%q) so that a NUL byte or invalid UTF-8 stays readable. ids is
// not modified.
func (r *Reaper) dropBadIDs(queue string, ids []string, res *Result) []string {
	kept := make([]string, 0, len(ids))
	var bad []string
	for _, id := range ids {
		if jobs.CheckID(id) != nil {
			bad = append(bad, id)
			continue
		}
		kept = append(kept, id)
	}
	if len(bad) == 0 {
		return kept
	}
	res.skip(SkipBadJobID, len(bad))
	shown := make([]string, 0, min(len(bad), badIDsShown))
	for _, id := range bad[:min(len(bad), badIDsShown)] {
		shown = append(shown, jobs.QuoteID(id))
	}
	r.log.Warn("active tasks skipped: their IDs cannot be job IDs (NUL byte, invalid UTF-8 or over the length limit); another producer shares this Redis?",
		"queue", queue, "reason", SkipBadJobID, "count", len(bad), "job_ids", strings.Join(shown, " "))
	return kept
}
