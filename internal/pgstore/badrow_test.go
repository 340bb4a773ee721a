package pgstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/jobreaper/jobreaper/internal/pgstore"
	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
)

// A row with an infinite timestamp (written by the product's own SQL)
// must not fail the load of the rows read with it, nor the statements that
// apply the stall rule to it: it is returned marked Unreadable and is
// never stalled by the SQL rule.
func TestRowWithAnInfiniteTimestampIsReadAndNeverStalled(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, store := setup(t, nil)
	for _, id := range []string{"a", "inf-upd", "neg-upd", "neg-start", "z"} {
		db.Insert(t, jobstest.Job{ID: id, Type: "report.export", Generation: 1, Queue: "default",
			StartedAgo: jobstest.Ago(31 * time.Minute), IdleAgo: 21 * time.Minute})
	}
	db.Exec(t, `UPDATE jobs SET updated_at = 'infinity' WHERE id = 'inf-upd'`)
	db.Exec(t, `UPDATE jobs SET updated_at = '-infinity' WHERE id = 'neg-upd'`)
	db.Exec(t, `UPDATE jobs SET started_at = '-infinity' WHERE id = 'neg-start'`)

	snaps, err := store.LoadForTasks(ctx, []string{"a", "inf-upd", "neg-upd", "neg-start", "z"})
	requireNoErr(t, err)
	want := map[string]string{"a": "", "inf-upd": "updated_at is infinity", "neg-upd": "updated_at is -infinity",
		"neg-start": "started_at is -infinity", "z": ""}
	for id, unreadable := range want {
		sn, ok := snaps[id]
		if !ok || sn.Unreadable != unreadable {
			t.Fatalf("%s loaded = %v, Unreadable = %q; want %q", id, ok, sn.Unreadable, unreadable)
		}
	}
	if snaps["neg-start"].StartedAt != nil || snaps["a"].StartedAt == nil || snaps["a"].UpdatedAt.IsZero() {
		t.Fatalf("times: neg-start started %v, a started %v updated %v", snaps["neg-start"].StartedAt,
			snaps["a"].StartedAt, snaps["a"].UpdatedAt)
	}

	// The lost-task search meets every one of them without an error and
	// returns the stalled ones plus those it can see are unreadable.
	lost, err := store.ListLostCandidates(ctx, pgstore.LostCandidatesParams{Queues: []string{"default"}, Rule: baselineRule})
	requireNoErr(t, err)
	var ids []string
	for _, sn := range lost {
		ids = append(ids, sn.ID)
	}
	if got, want := len(ids), 4; got != want { // inf-upd is never idle, so never read there
		t.Fatalf("lost candidates = %v, want a, neg-upd, neg-start, z", ids)
	}

	// A reap naming the rows as read changes only the readable ones.
	var cands []pgstore.ReapCandidate
	for _, id := range []string{"a", "inf-upd", "neg-upd", "neg-start", "z"} {
		cands = append(cands, pgstore.ReapCandidate{JobID: id, Generation: 1, UpdatedAt: snaps[id].UpdatedAt})
	}
	res, err := store.ReapBatch(ctx, pgstore.ReapBatchParams{Candidates: cands, Reason: jobs.ReasonStalled, Rule: baselineRule})
	requireNoErr(t, err)
	if len(res.Reaped) != 2 || res.Reaped[0].JobID != "a" || res.Reaped[1].JobID != "z" || len(res.Changed) != 3 {
		t.Fatalf("reap = %+v, want a and z reaped, the 3 others changed_since_read", res)
	}
	var processing int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM jobs WHERE status = 'PROCESSING' AND id IN ('inf-upd', 'neg-upd', 'neg-start')`).Scan(&processing); err != nil || processing != 3 {
		t.Fatalf("unreadable rows still PROCESSING = %d (%v), want 3", processing, err)
	}
}
