package pgstore_test

import (
	"context"
	"reflect"
	"testing"
	"time"

	"github.com/jobreaper/jobreaper/jobs/jobstest"
)

// The batched load scans rows with one reused set of targets, interned
// strings and one Limits per type (pgcore.SnapshotScanner): every row it
// returns must equal the one-row read (pgcore.ScanSnapshot through Get),
// whatever the row holds: NULLs, no job_types row, a type without a stall
// timeout, infinite timestamps, two types with the same limits.
func TestLoadForTasksReadsRowsAsGetDoes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, store := setup(t, nil)
	db.JobType(t, "nostall.type", "10 minutes", "", "")
	db.JobType(t, "twin.type", "1 hour", "20 minutes", "2 hours")
	db.JobType(t, "twin.type2", "1 hour", "20 minutes", "2 hours")
	jobsIn := []jobstest.Job{
		{ID: "a", Type: "report.export", Generation: 3, Queue: "q1", ParentID: "P1", Worker: "w1",
			StartedAgo: jobstest.Ago(31 * time.Minute), IdleAgo: 21 * time.Minute},
		{ID: "b", Type: "report.export", Generation: 1, Queue: "q1", Worker: "w1",
			StartedAgo: jobstest.Ago(time.Minute), IdleAgo: time.Second},
		{ID: "c", Type: "nostall.type", Generation: 2, StartedAgo: jobstest.Ago(time.Hour), IdleAgo: time.Minute},
		{ID: "d", Type: "no.such.type", Generation: 1, Queue: "q2", IdleAgo: time.Minute},
		{ID: "e", Type: "twin.type", Generation: 1, Queue: "q2", Worker: "w2", StartedAgo: jobstest.Ago(time.Minute)},
		{ID: "f", Type: "twin.type2", Generation: 1, Queue: "q1", Worker: "w2", StartedAgo: jobstest.Ago(time.Minute)},
		{ID: "g", Type: "report.export", Status: "FAILED", Generation: 1, Queue: "q1"},
		{ID: "h", Type: "report.export", Generation: 1, Queue: "q1", StartedAgo: jobstest.Ago(time.Minute)},
	}
	var ids []string
	for _, j := range jobsIn {
		db.Insert(t, j)
		ids = append(ids, j.ID)
	}
	db.Exec(t, `UPDATE jobs SET failure_reason = 'stalled' WHERE id = 'g'`)
	db.Exec(t, `UPDATE jobs SET updated_at = 'infinity', started_at = '-infinity' WHERE id = 'h'`)
	snaps, err := store.LoadForTasks(ctx, append(ids, "missing"))
	requireNoErr(t, err)
	if len(snaps) != len(ids) {
		t.Fatalf("loaded %d rows, want %d", len(snaps), len(ids))
	}
	for _, id := range ids {
		want, err := store.Get(ctx, id)
		requireNoErr(t, err)
		if got := snaps[id]; !reflect.DeepEqual(got, want) {
			t.Fatalf("%s loaded as\n%+v\nGet reads\n%+v", id, got, want)
		}
	}
	if snaps["a"].Limits != snaps["b"].Limits {
		t.Fatal("two rows of one type do not share their Limits")
	}
	if snaps["e"].Limits == snaps["f"].Limits || !reflect.DeepEqual(*snaps["e"].Limits, *snaps["f"].Limits) {
		t.Fatal("two types with the same limits: want equal, separate Limits")
	}
}
