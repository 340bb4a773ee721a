package soak

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jobreaper/jobreaper/internal/asynqstate"
	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/queue"
	"github.com/jobreaper/jobreaper/queue/redistest"
)

// The soak's check finds each kind of broken job: a soak that reports 0
// violations means something only if its check would have reported them.
// Rows of every kind as they must end pass; each one changed in one way is
// named.
func TestSoakCheckFindsEachBrokenRule(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb := redistest.Start(t).Client(t)
	markers, err := queue.NewMarkerStore(rdb)
	if err != nil {
		t.Fatal(err)
	}
	reapedAt := time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC)
	detail := fmt.Appendf(nil, `{"generation":1,"updated_at":%q}`, reapedAt.Format(time.RFC3339Nano))
	gen1 := int64(1)
	completed := func(kind string, generation int64) soakRow {
		return soakRow{id: "J-" + kind, typ: "soak." + kind, status: jobs.StatusCompleted, generation: generation,
			cursor: 20, total: 20, items: 20, distinctItems: 20, results: 1, charges: 1, completions: 1, completedEvents: 1}
	}
	reaped := func(kind string) soakRow {
		return soakRow{id: "J-" + kind, typ: "soak." + kind, status: jobs.StatusFailed, reason: jobs.ReasonStalled,
			generation: 1, cursor: 5, total: 20, items: 5, distinctItems: 5, failures: 1, reapedEvents: 1,
			reapedGeneration: &gen1, reapedDetail: detail, updatedAt: reapedAt, lateRejected: 3}
	}
	for _, id := range []string{"J-stall", "J-late"} {
		if _, err := asynqstate.NewMarkerWriter(rdb, 0).Set(ctx, id, 1, time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	good := []soakRow{
		completed("normal", 1),
		completed("flaky", 2),
		{id: "J-doomed", typ: "soak.doomed", status: jobs.StatusFailed, reason: "soak_doomed", generation: 2,
			cursor: 10, total: 20, items: 10, distinctItems: 10, failures: 1},
		reaped("stall"),
		reaped("late"),
	}
	for _, r := range good {
		if broken := soakBroken(ctx, r, markers); broken != "" {
			t.Errorf("%s as it must end: %s", r.id, broken)
		}
	}

	gen2 := int64(2)
	bad := map[string]func() soakRow{
		"a product row written twice":          func() soakRow { r := completed("normal", 1); r.items = 21; return r },
		"product rows without their batch":     func() soakRow { r := reaped("late"); r.items, r.distinctItems = 10, 10; return r },
		"charged twice":                        func() soakRow { r := completed("normal", 1); r.charges = 2; return r },
		"completion cascade run twice":         func() soakRow { r := completed("flaky", 2); r.completions = 2; return r },
		"completed without its charge":         func() soakRow { r := completed("normal", 1); r.charges = 0; return r },
		"completed short of its total":         func() soakRow { r := completed("normal", 1); r.cursor, r.items, r.distinctItems = 15, 15, 15; return r },
		"completed and reaped":                 func() soakRow { r := completed("normal", 1); r.reapedEvents = 1; return r },
		"a reaped job charged by a late write": func() soakRow { r := reaped("late"); r.charges = 1; return r },
		"a reaped job's failure cascade twice": func() soakRow { r := reaped("stall"); r.failures = 2; return r },
		"a live job reaped": func() soakRow {
			r := reaped("stall")
			r.id, r.typ = "J-normal", "soak.normal"
			return r
		},
		"a flaky job completed without its retry": func() soakRow { return completed("flaky", 1) },
		"a doomed job reaped": func() soakRow {
			r := reaped("stall")
			r.id, r.typ = "J-doomed", "soak.doomed"
			return r
		},
		"a hung job completed":                 func() soakRow { r := reaped("stall"); r.status, r.reason = jobs.StatusCompleted, ""; return r },
		"a hung job failed by its handler":     func() soakRow { r := reaped("stall"); r.reason = "handler_error"; return r },
		"two reaped events":                    func() soakRow { r := reaped("stall"); r.reapedEvents = 2; return r },
		"a reaped event of another generation": func() soakRow { r := reaped("stall"); r.reapedGeneration = &gen2; return r },
		"updated_at moved after the reap": func() soakRow {
			r := reaped("late")
			r.updatedAt = reapedAt.Add(time.Second)
			return r
		},
		"late writes not refused": func() soakRow { r := reaped("late"); r.lateRejected = 0; return r },
		"no marker":               func() soakRow { r := reaped("stall"); r.id = "J-no-marker"; return r },
		"a marker of another generation": func() soakRow {
			r := reaped("stall")
			r.generation, r.reapedGeneration = 2, &gen2
			return r
		},
	}
	for name, mk := range bad {
		if broken := soakBroken(ctx, mk(), markers); broken == "" {
			t.Errorf("%s: not found", name)
		}
	}
}
