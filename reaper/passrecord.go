package reaper

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/jobreaper/jobreaper/internal/pgstore"
	"github.com/jobreaper/jobreaper/jobs"
)

// PassRecorder stores a pass record: pgstore.Store.RecordPass.
type PassRecorder interface {
	RecordPass(ctx context.Context, r pgstore.PassRecord) error
}

// PassRecord makes the daemon record each pass that ran to its end (one
// upsert of its queue set's row), so that the status page of every
// replica shows what the leader saw.
type PassRecord struct {
	Store PassRecorder
	// Key is the queue set (pgstore.LeaderLeaseKey); HolderID and
	// HolderHost name this daemon.
	Key, HolderID, HolderHost string
}

// passNotes are the decisions of a pass its record keeps, each list at
// most pgstore.PassRecordListMax long (the first ones judged).
type passNotes struct {
	atRisk, candidates []Decision
	// seen keeps a job judged twice in one pass (a stalled job the
	// lost-task search looks up again) to one entry per list.
	seen map[string]bool
}

// note keeps, in a real pass with a pass record, the jobs at risk and the
// candidates (verdict reap: reaped, held or found changed); a candidate is
// not also listed at risk.
func (r *Reaper) note(res *Result, id string, snap *jobs.Snapshot, v Verdict, reapReason string) {
	if r.opts.PassRecord == nil {
		return
	}
	n := &res.notes
	if n.seen == nil {
		n.seen = map[string]bool{}
	}
	if n.seen[id] {
		return
	}
	// A stalled job is a candidate, no longer a warning (AtRisk is false
	// for a verdict to reap).
	risk := AtRisk(v)
	if !risk && !v.Reap {
		return
	}
	n.seen[id] = true
	d := decision(id, snap, v, reapReason)
	if v.Reap && len(n.candidates) < pgstore.PassRecordListMax {
		n.candidates = append(n.candidates, d)
	}
	if risk && len(n.atRisk) < pgstore.PassRecordListMax {
		n.atRisk = append(n.atRisk, d)
	}
}

// recordPass writes the pass record of res, a pass that ran to its end.
// A failure is logged: the page shows the previous record meanwhile.
func (r *Reaper) recordPass(ctx context.Context, res Result) {
	p := r.opts.PassRecord
	rec := pgstore.PassRecord{Key: p.Key, HolderID: p.HolderID, HolderHost: p.HolderHost}
	var err error
	if rec.Summary, err = json.Marshal(res); err == nil {
		if rec.AtRisk, err = json.Marshal(orEmpty(res.notes.atRisk)); err == nil {
			rec.Candidates, err = json.Marshal(orEmpty(res.notes.candidates))
		}
	}
	if err != nil {
		err = fmt.Errorf("encoding the pass record: %w", err)
	} else {
		err = p.Store.RecordPass(ctx, rec)
	}
	if err != nil {
		r.log.Warn("recording the pass for the status page failed; the page shows the previous pass", "err", err)
	}
}

func orEmpty(d []Decision) []Decision {
	if d == nil {
		return []Decision{}
	}
	return d
}
