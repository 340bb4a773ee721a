package fleettest_test

import (
	"strings"
	"testing"
	"time"

	"github.com/jobreaper/jobreaper/internal/fleettest"
)

// t0 is the hand-made histories' origin; ms(n) is n milliseconds after it.
var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

func ms(n int) time.Time { return t0.Add(time.Duration(n) * time.Millisecond) }

const stall = 10 * time.Second

// cleanHistory is a run that breaks nothing: a normal job completes with
// its charge; a slow one heartbeats for 30 s past its max_runtime and
// completes; a stalling one is reaped 12 s after its last heartbeat by the
// lease holder, with its marker; a retried one fails its first attempt and
// completes its second; a late one is reaped and its late completion
// refused (nothing written).
func cleanHistory() fleettest.History {
	tr := func(at int, id string, gen int64, status, worker string) fleettest.Transition {
		return fleettest.Transition{At: ms(at), JobID: id, Generation: gen, Status: status, UpdatedAt: ms(at), Worker: worker}
	}
	h := fleettest.History{
		Transitions: []fleettest.Transition{
			tr(0, "N", 0, "QUEUED", ""), tr(100, "N", 1, "PROCESSING", "w1"), tr(200, "N", 1, "COMPLETED", "w1"),
			tr(0, "S", 0, "QUEUED", ""), tr(100, "S", 1, "PROCESSING", "w2"),
			tr(0, "H", 0, "QUEUED", ""), tr(100, "H", 1, "PROCESSING", "w3"), tr(2100, "H", 1, "PROCESSING", "w3"),
			tr(14100, "H", 1, "FAILED", "w3"),
			tr(0, "R", 0, "QUEUED", ""), tr(100, "R", 1, "PROCESSING", "w1"), tr(300, "R", 1, "QUEUED", "w1"),
			tr(1300, "R", 2, "PROCESSING", "w2"), tr(1400, "R", 2, "COMPLETED", "w2"),
			tr(0, "L", 0, "QUEUED", ""), tr(100, "L", 1, "PROCESSING", "w2"), tr(13100, "L", 1, "FAILED", "w2"),
		},
		Reaps: []fleettest.ReapEvent{
			{JobID: "H", Generation: 1, DBNow: ms(14090), HolderID: "A", UpdatedAt: ms(2100), StallTimeout: stall},
			{JobID: "L", Generation: 1, DBNow: ms(13090), HolderID: "B", UpdatedAt: ms(100), StallTimeout: stall},
		},
		Leases: []fleettest.LeaseVersion{
			{At: ms(0), HolderID: "A", ExpiresAt: ms(5000)}, {At: ms(4000), HolderID: "A", ExpiresAt: ms(9000)},
			{At: ms(8000), HolderID: "A", ExpiresAt: ms(15000)},
			// A is killed; B takes over at 13 s... the lease row of one key
			// changes holder only after A's expired.
		},
		Charges: []fleettest.Charge{{JobID: "N", Generation: 1}, {JobID: "R", Generation: 2}},
		Markers: map[string]bool{"H": true, "L": true},
		Kinds: map[string]string{"N": fleettest.KindNormal, "S": fleettest.KindSlow, "H": fleettest.KindStalling,
			"R": fleettest.KindRetried, "L": fleettest.KindLate},
		Killed:     map[string]time.Time{},
		StallBound: 10*time.Second + 2*time.Second + 5*time.Second,
		End:        ms(40000),
	}
	// The slow job heartbeats every 2 s for 30 s, then completes.
	for at := 2100; at <= 30100; at += 2000 {
		h.Transitions = append(h.Transitions, tr(at, "S", 1, "PROCESSING", "w2"))
	}
	h.Transitions = append(h.Transitions, tr(30200, "S", 1, "COMPLETED", "w2"))
	h.Charges = append(h.Charges, fleettest.Charge{JobID: "S", Generation: 1})
	// L's reap is B's, after a takeover at 12.9 s of A's lease (expired
	// at... A renewed until 15 s; make B's takeover follow A's release).
	h.Leases = append(h.Leases, fleettest.LeaseVersion{At: ms(12000), HolderID: ""},
		fleettest.LeaseVersion{At: ms(12500), HolderID: "B", ExpiresAt: ms(13500)},
		fleettest.LeaseVersion{At: ms(13400), HolderID: "A", ExpiresAt: ms(20000)})
	return h
}

func TestCheckPassesACleanHistory(t *testing.T) {
	res := fleettest.Check(cleanHistory())
	if len(res.Violations) != 0 || res.Reaps != 2 || res.FalseReaps != 0 || res.DoubleEffects != 0 {
		t.Fatalf("a clean history: %+v", res)
	}
	if d := res.ReapDelays[fleettest.KindStalling]; len(d) != 1 || d[0] != 12*time.Second {
		t.Fatalf("the stalling job's reap delay = %v, want [12s]", d)
	}
}

// Each broken history is the clean one with one thing wrong, and Check
// names it.
func TestCheckCatchesEachViolation(t *testing.T) {
	tr := func(at int, id string, gen int64, status, worker string) fleettest.Transition {
		return fleettest.Transition{At: ms(at), JobID: id, Generation: gen, Status: status, UpdatedAt: ms(at), Worker: worker}
	}
	for _, c := range []struct {
		name   string
		break_ func(h *fleettest.History)
		want   string
		count  func(fleettest.Verdict) int
	}{
		{"a second terminal transition", func(h *fleettest.History) {
			h.Transitions = append(h.Transitions, tr(15000, "H", 1, "PROCESSING", "w3"), tr(15100, "H", 1, "COMPLETED", "w3"))
		}, "2 terminal transitions", func(r fleettest.Verdict) int { return r.DoubleEffects }},
		{"a late write after the reap", func(h *fleettest.History) {
			h.Transitions = append(h.Transitions, tr(13200, "L", 1, "COMPLETED", "w2"))
		}, "a write landed after its terminal FAILED", nil},
		{"a charge without COMPLETED", func(h *fleettest.History) {
			h.Charges = append(h.Charges, fleettest.Charge{JobID: "L", Generation: 1})
		}, "without that generation COMPLETED", func(r fleettest.Verdict) int { return r.DoubleEffects }},
		{"two charges", func(h *fleettest.History) {
			h.Charges = append(h.Charges, fleettest.Charge{JobID: "N", Generation: 1})
		}, "2 charges", func(r fleettest.Verdict) int { return r.DoubleEffects }},
		{"a slow job reaped 3 s after its heartbeat", func(h *fleettest.History) {
			h.Transitions = append(h.Transitions, tr(33000, "S2", 1, "PROCESSING", "w2"), tr(36000, "S2", 1, "FAILED", "w2"))
			h.Kinds["S2"], h.Markers["S2"] = fleettest.KindSlow, true
			h.Leases = append(h.Leases, fleettest.LeaseVersion{At: ms(30000), HolderID: "A", ExpiresAt: ms(60000)})
			h.Reaps = append(h.Reaps, fleettest.ReapEvent{JobID: "S2", Generation: 1, DBNow: ms(35990), HolderID: "A", StallTimeout: stall})
		}, "false reap: S2", func(r fleettest.Verdict) int { return r.FalseReaps }},
		{"a normal job reaped during its worker's cut", func(h *fleettest.History) {
			h.Transitions = append(h.Transitions, tr(20000, "C", 1, "PROCESSING", "w1"), tr(33000, "C", 1, "FAILED", "w1"))
			h.Kinds["C"], h.Markers["C"] = fleettest.KindSlow, true
			h.Outages = append(h.Outages, fleettest.Outage{Kind: "workers_cut", Start: ms(20100), End: ms(34000), Processes: []string{"w1"}})
			h.Leases = append(h.Leases, fleettest.LeaseVersion{At: ms(30000), HolderID: "A", ExpiresAt: ms(60000)})
			h.Reaps = append(h.Reaps, fleettest.ReapEvent{JobID: "C", Generation: 1, DBNow: ms(32990), HolderID: "A", StallTimeout: stall})
		}, "in an outage: true", func(r fleettest.Verdict) int { return r.FalseReaps }},
		{"a reap 5 s after a shared outage's end", func(h *fleettest.History) {
			h.Transitions = append(h.Transitions, tr(20000, "G", 1, "PROCESSING", "w1"), tr(40000, "G", 1, "FAILED", "w1"))
			h.Kinds["G"], h.Markers["G"] = fleettest.KindNormal, true
			h.Outages = append(h.Outages, fleettest.Outage{Kind: "pg_restart", Start: ms(21000), End: ms(35000)})
			h.Leases = append(h.Leases, fleettest.LeaseVersion{At: ms(30000), HolderID: "A", ExpiresAt: ms(60000)})
			h.Reaps = append(h.Reaps, fleettest.ReapEvent{JobID: "G", Generation: 1, DBNow: ms(39990), HolderID: "A", StallTimeout: stall})
		}, "false reap: G", func(r fleettest.Verdict) int { return r.FalseReaps }},
		{"a reap by a replica that did not hold the lease", func(h *fleettest.History) {
			h.Reaps[0].HolderID = "B"
		}, `by holder "B"`, nil},
		{"a reap committed after the lease expired", func(h *fleettest.History) {
			h.Leases = h.Leases[:2]
		}, `by holder "A"`, nil},
		{"a reaped job without its marker", func(h *fleettest.History) {
			delete(h.Markers, "H")
		}, "no marker at the end", nil},
		{"two reaped events of one generation", func(h *fleettest.History) {
			h.Reaps = append(h.Reaps, h.Reaps[0])
		}, "2 reaped events", nil},
		{"a stalling job reaped too late", func(h *fleettest.History) {
			h.StallBound = 11 * time.Second
		}, "over the bound", nil},
		{"a stalling job never reaped", func(h *fleettest.History) {
			h.Transitions = append(h.Transitions, tr(0, "H2", 0, "QUEUED", ""), tr(100, "H2", 1, "PROCESSING", "w3"))
			h.Kinds["H2"] = fleettest.KindStalling
		}, "H2 generation 1 (stalling): never reaped", nil},
		{"a generation going back", func(h *fleettest.History) {
			h.Transitions = append(h.Transitions, tr(30300, "S", 0, "COMPLETED", "w2"))
		}, "generation went back", nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := cleanHistory()
			c.break_(&h)
			res := fleettest.Check(h)
			if !strings.Contains(strings.Join(res.Violations, "\n"), c.want) {
				t.Fatalf("Check missed %s: want a violation with %q, got %q", c.name, c.want, res.Violations)
			}
			if c.count != nil && c.count(res) == 0 {
				t.Fatalf("%s: counted 0 in %+v", c.name, res)
			}
		})
	}
}

// A reap of a killed worker's attempt is counted apart, never a false
// reap; a reap with retry: true needs no marker.
func TestCheckCountsKilledAttemptsApartAndRetriesWithoutMarkers(t *testing.T) {
	h := cleanHistory()
	h.Transitions = append(h.Transitions, fleettest.Transition{At: ms(20000), JobID: "K", Generation: 1, Status: "PROCESSING", Worker: "w9"},
		fleettest.Transition{At: ms(21000), JobID: "K", Generation: 1, Status: "QUEUED", Worker: "w9"})
	h.Kinds["K"] = fleettest.KindNormal
	h.Killed["w9"] = ms(20500)
	h.Leases = append(h.Leases, fleettest.LeaseVersion{At: ms(20000), HolderID: "A", ExpiresAt: ms(60000)})
	h.Reaps = append(h.Reaps, fleettest.ReapEvent{JobID: "K", Generation: 1, DBNow: ms(20990), HolderID: "A", Retry: true, StallTimeout: stall})
	res := fleettest.Check(h)
	if len(res.Violations) != 0 || res.KilledReaps != 1 || res.FalseReaps != 0 {
		t.Fatalf("a killed attempt reaped with retry: %+v", res)
	}
}
