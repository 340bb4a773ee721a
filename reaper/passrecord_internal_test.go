package reaper

import (
	"context"
	"encoding/json"
	"log/slog"
	"testing"
	"time"

	"github.com/jobreaper/jobreaper/internal/pgstore"
	"github.com/jobreaper/jobreaper/jobs"
)

type recordedPasses struct{ got []pgstore.PassRecord }

func (r *recordedPasses) RecordPass(_ context.Context, p pgstore.PassRecord) error {
	r.got = append(r.got, p)
	return nil
}

// A pass's record keeps the stalled jobs as candidates, the others at
// risk, each once and at most PassRecordListMax of each.
func TestPassRecordLists(t *testing.T) {
	t.Parallel()
	rec := &recordedPasses{}
	r := &Reaper{opts: Options{PassRecord: &PassRecord{Store: rec, Key: `["q"]`, HolderID: "h", HolderHost: "host"}}}
	r.log = slog.New(slog.DiscardHandler)
	res := newResult()
	stalled := Verdict{Reap: true, Runtime: time.Hour, Idle: 20 * time.Minute, MaxRuntime: 30 * time.Minute, StallTimeout: 10 * time.Minute}
	risky := Verdict{Skip: SkipProgressing, Runtime: time.Hour, Idle: 6 * time.Minute, MaxRuntime: 30 * time.Minute, StallTimeout: 10 * time.Minute}
	calm := Verdict{Skip: SkipProgressing, Runtime: time.Hour, Idle: time.Minute, MaxRuntime: 30 * time.Minute, StallTimeout: 10 * time.Minute}
	snap := func(id string) *jobs.Snapshot {
		return &jobs.Snapshot{ID: id, Type: "t", Queue: "q", Status: jobs.StatusProcessing, Generation: 2, Worker: "w"}
	}
	r.decided(&res, "S", snap("S"), stalled, jobs.ReasonStalled)
	r.decided(&res, "S", snap("S"), stalled, jobs.ReasonLostTask) // judged again: kept once
	r.decided(&res, "C", snap("C"), calm, "")
	for i := range pgstore.PassRecordListMax + 5 {
		id := "R" + string(rune('a'+i%26)) + time.Duration(i).String()
		r.decided(&res, id, snap(id), risky, "")
	}
	r.recordPass(t.Context(), res)
	if len(rec.got) != 1 {
		t.Fatalf("%d records, want 1", len(rec.got))
	}
	var cands, risk []Decision
	if err := json.Unmarshal(rec.got[0].Candidates, &cands); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(rec.got[0].AtRisk, &risk); err != nil {
		t.Fatal(err)
	}
	if len(cands) != 1 || cands[0].JobID != "S" || cands[0].Reason != jobs.ReasonStalled || cands[0].Generation != 2 {
		t.Fatalf("candidates = %+v, want S alone, as stalled", cands)
	}
	if len(risk) != pgstore.PassRecordListMax || risk[0].Decision != DecisionSkip || risk[0].IdleSeconds != 360 {
		t.Fatalf("%d at risk (first %+v), want %d", len(risk), risk[0], pgstore.PassRecordListMax)
	}
	for _, d := range risk {
		if d.JobID == "S" || d.JobID == "C" {
			t.Fatalf("%s is listed at risk", d.JobID)
		}
	}
}
