package statuspage

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/jobreaper/jobreaper/internal/limits"
	"github.com/jobreaper/jobreaper/internal/pgstore"
	"github.com/jobreaper/jobreaper/reaper"
)

// Overview is everything the page at / shows. A part that could not be
// read is missing, and Errors says why, one sentence each.
type Overview struct {
	// DBNow is the database's clock when the page was gathered (zero when
	// PostgreSQL could not be read).
	DBNow time.Time
	// Errors are the failures met gathering the page (PostgreSQL or
	// Redis down, a timeout), shown in the error block.
	Errors []string
	// Passes are each queue set's last pass record, as its leader wrote
	// it.
	Passes []Pass
	// Leases are the leader lease rows; Drift the differences between
	// this daemon's settings and its queue set's leader's.
	Leases []Lease
	Drift  []string
	// Reaps are the last reaps, newest first.
	Reaps []Reap
	// Limits is the suggest-limits table, computed at LimitsAt; nil when
	// it could not be computed yet.
	Limits   *limits.Report
	LimitsAt time.Time
	// EvictionPolicy is Redis's maxmemory-policy ("" when unread);
	// EvictionWarning says why it puts markers at risk ("" when safe).
	EvictionPolicy, EvictionWarning string
}

// Pass is one queue set's last pass record.
type Pass struct {
	Key, HolderID, HolderHost string
	At                        time.Time
	Summary                   Summary
	AtRisk, Candidates        []Decision
}

// Summary is the part of a pass's summary the page shows (the JSON of run
// --once --output json).
type Summary struct {
	Scanned        int            `json:"scanned"`
	Reaped         int            `json:"reaped"`
	Errors         int            `json:"errors"`
	Skipped        map[string]int `json:"skipped"`
	StaleQueued    int            `json:"stale_queued"`
	BrokenActive   int            `json:"broken_active"`
	StallStormHeld int            `json:"stall_storm_held"`
	Interrupted    bool           `json:"interrupted"`
}

// Decision is one job of a pass record's lists, as the reaper records it.
type Decision = reaper.Decision

// Reap is one reaped event and its evidence.
type Reap struct {
	JobID, Type, Queue, Worker string
	Generation                 int64
	At                         time.Time
	Reason                     string     `json:"reason"`
	RuntimeSeconds             float64    `json:"runtime_seconds"`
	IdleSeconds                float64    `json:"idle_seconds"`
	MaxRuntimeSeconds          float64    `json:"max_runtime_seconds"`
	StallTimeoutSeconds        float64    `json:"stall_timeout_seconds"`
	DBNow                      time.Time  `json:"db_now"`
	OutageEnd                  *time.Time `json:"outage_end"`
}

// Lease is one leader lease row.
type Lease struct {
	Key, Holder                      string
	AcquiredAt, RenewedAt, ExpiresAt time.Time
	// Live: not expired at the read; Mine: held by this daemon.
	Live, Mine bool
}

// DecodePass reads a pass record. Its error names the part that is not
// the JSON a pass writes.
func DecodePass(r pgstore.PassRecord) (Pass, error) {
	p := Pass{Key: r.Key, HolderID: r.HolderID, HolderHost: r.HolderHost, At: r.At}
	for _, part := range []struct {
		name string
		raw  json.RawMessage
		into any
	}{{"summary", r.Summary, &p.Summary}, {"at_risk", r.AtRisk, &p.AtRisk}, {"candidates", r.Candidates, &p.Candidates}} {
		if err := json.Unmarshal(part.raw, part.into); err != nil {
			return p, fmt.Errorf("the pass record of queue set %s has an unreadable %s: %w", r.Key, part.name, err)
		}
	}
	return p, nil
}

// DecodeReap reads a reaped event; a detail that is not the evidence's
// JSON leaves those fields empty.
func DecodeReap(r pgstore.ReapRecord) Reap {
	out := Reap{}
	_ = json.Unmarshal(r.Detail, &out)
	out.JobID, out.Type, out.Queue, out.Worker, out.Generation, out.At = r.JobID, r.Type, r.Queue, r.Worker, r.Generation, r.At
	return out
}
