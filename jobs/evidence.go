package jobs

import (
	"encoding/json"

	"github.com/jobreaper/jobreaper/internal/idcheck"
)

// This file holds the attempt's evidence that limits are tuned from: the
// longest progress gap (jobs.max_idle_gap) that every write moving
// updated_at or ending the attempt keeps in its own statement, and the
// runtime and gap the completed and failed events carry.

// keepIdleGapSQL is the SET item that keeps the attempt's longest progress
// gap, for an UPDATE of jobs aliased j that runs at now(): the gap since
// the last recorded write (updated_at, read before the statement moves
// it) when it is longer than the longest one kept so far. A NULL kept gap
// (a row claimed before the column existed) counts as none; an updated_at
// of 'infinity' or '-infinity', which other SQL can write and PostgreSQL
// cannot subtract, adds no gap instead of failing the write.
const keepIdleGapSQL = `max_idle_gap = greatest(j.max_idle_gap, CASE WHEN isfinite(j.updated_at) THEN now() - j.updated_at END)`

// attemptEvidenceSQL returns, after an UPDATE of jobs aliased j that ends
// the attempt and kept the gap (keepIdleGapSQL), the attempt's runtime
// (now() - started_at) and its longest progress gap, in seconds; NULL
// where the row holds none (no or an infinite start time, a gap never
// kept).
const attemptEvidenceSQL = `CASE WHEN isfinite(j.started_at) THEN extract(epoch FROM now() - j.started_at)::float8 END,
          extract(epoch FROM j.max_idle_gap)::float8`

// attemptEvidence is what the final write of an attempt read of it, for
// its event's detail and the runtime histogram.
type attemptEvidence struct {
	// RuntimeSeconds and MaxIdleGapSeconds are nil when the row holds no
	// start time or no gap.
	RuntimeSeconds    *float64 `json:"runtime_seconds,omitempty"`
	MaxIdleGapSeconds *float64 `json:"max_idle_gap_seconds,omitempty"`
}

// detail returns the event detail of the attempt's end: extra's fields
// (each a JSON value) and the evidence's.
func (e attemptEvidence) detail(extra map[string]any) ([]byte, error) {
	out := map[string]any{}
	for k, v := range extra {
		out[k] = v
	}
	if e.RuntimeSeconds != nil {
		out["runtime_seconds"] = *e.RuntimeSeconds
	}
	if e.MaxIdleGapSeconds != nil {
		out["max_idle_gap_seconds"] = *e.MaxIdleGapSeconds
	}
	return json.Marshal(out)
}

// invalidLabel is the label value a job type that fails idcheck.CheckName
// is counted under, as the reaper's metrics count it: such a name can be
// no label value, and its observation must not be lost.
const invalidLabel = "(invalid)"

// labelValue returns name when it can be a metric label value, else
// invalidLabel.
func labelValue(name string) string {
	if idcheck.CheckName("name", name) != nil {
		return invalidLabel
	}
	return name
}
