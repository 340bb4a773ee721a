package pgstore_test

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/jobreaper/jobreaper/internal/pgstore"
	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
)

// The holds' statements on the database clock: StartHold stores the
// queues and types sorted and once each; OpenHolds finds a hold by any of
// its queues; DrainHolds records queue by queue the first pass after a
// hold's end (a replica of another queue set drains only its own) and
// leaves a hold in effect alone; a hold whose every queue is drained is
// not read again; ReleaseHolds ends only holds in effect, whole, records
// who and why, and refuses a blank reason.
func TestHoldsStatements(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := jobstest.New(t)
	s := stores(db, nil)

	if _, err := s.StartHold(ctx, pgstore.StartHoldParams{For: time.Minute}); !errors.Is(err, jobs.ErrInvalidArgument) {
		t.Fatalf("StartHold without a queue = %v, want ErrInvalidArgument", err)
	}
	h, err := s.StartHold(ctx, pgstore.StartHoldParams{Queues: []string{"b", "a", "b"}, Types: []string{"y", "x", "x"},
		Held: 120, Judged: 130, Tripped: "120 stalled", For: 15 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(h.Queues, []string{"a", "b"}) || !slices.Equal(h.Types, []string{"x", "y"}) || h.Held != 120 ||
		h.Judged != 130 || h.Until.Sub(h.StartedAt) != 15*time.Minute || !h.InEffect(h.StartedAt) || h.InEffect(h.Until) {
		t.Fatalf("hold = %+v", h)
	}
	for _, qs := range [][]string{{"a"}, {"b", "zz"}} {
		if got, err := s.OpenHolds(ctx, qs); err != nil || len(got) != 1 || got[0].ID != h.ID {
			t.Fatalf("OpenHolds(%v) = %+v, %v; want hold %d", qs, got, err, h.ID)
		}
	}
	if got, err := s.OpenHolds(ctx, []string{"c"}); err != nil || len(got) != 0 {
		t.Fatalf("OpenHolds(c) = %+v, %v; want none", got, err)
	}
	now, err := s.Now(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// In effect: a drain changes nothing.
	if err := s.DrainHolds(ctx, []int64{h.ID}, []string{"a", "b"}, now); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.OpenHolds(ctx, []string{"a"}); len(got) != 1 || len(got[0].Drained) != 0 {
		t.Fatalf("a hold in effect was drained: %+v", got)
	}

	if _, err := s.ReleaseHolds(ctx, pgstore.ReleaseHoldsParams{Reason: " "}); !errors.Is(err, jobs.ErrInvalidArgument) {
		t.Fatalf("ReleaseHolds with a blank reason = %v, want ErrInvalidArgument", err)
	}
	if got, err := s.ReleaseHolds(ctx, pgstore.ReleaseHoldsParams{Queues: []string{"c"}, By: "ops@host", Reason: "other"}); err != nil || len(got) != 0 {
		t.Fatalf("ReleaseHolds(c) = %+v, %v; want none", got, err)
	}
	got, err := s.ReleaseHolds(ctx, pgstore.ReleaseHoldsParams{Queues: []string{"b"}, By: "ops@host", Reason: "they hang"})
	if err != nil || len(got) != 1 || got[0].ID != h.ID || got[0].ReleasedAt == nil || got[0].ReleasedBy != "ops@host" ||
		got[0].Reason != "they hang" || !slices.Equal(got[0].Queues, []string{"a", "b"}) {
		t.Fatalf("ReleaseHolds(b) = %+v, %v; want the whole hold, released by ops@host", got, err)
	}
	if again, err := s.ReleaseHolds(ctx, pgstore.ReleaseHoldsParams{By: "ops@host", Reason: "again"}); err != nil || len(again) != 0 {
		t.Fatalf("a second ReleaseHolds = %+v, %v; want none", again, err)
	}

	// Over: a replica of queue a drains a, one of b and c drains b.
	if now, err = s.Now(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.DrainHolds(ctx, []int64{h.ID}, []string{"a"}, now); err != nil {
		t.Fatal(err)
	}
	open, err := s.OpenHolds(ctx, []string{"b"})
	if err != nil || len(open) != 1 || !slices.Equal(open[0].Drained, []string{"a"}) {
		t.Fatalf("after draining a: %+v, %v; want the hold open with a drained", open, err)
	}
	if err := s.DrainHolds(ctx, []int64{h.ID}, []string{"b", "c"}, now); err != nil {
		t.Fatal(err)
	}
	if open, err := s.OpenHolds(ctx, []string{"a", "b"}); err != nil || len(open) != 0 {
		t.Fatalf("after draining both queues: %+v, %v; want the hold no longer read", open, err)
	}
	if n := db.Count(t, `SELECT count(*) FROM `+db.Table("reaper_holds")+` WHERE drained = '{a,b}' AND drained_at IS NOT NULL`); n != 1 {
		t.Fatal("the drained hold does not record both queues and its drain time")
	}
}
