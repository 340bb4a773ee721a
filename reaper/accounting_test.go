package reaper_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jobreaper/jobreaper/internal/asynqstate"
	"github.com/jobreaper/jobreaper/internal/pgstore"
	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
	"github.com/jobreaper/jobreaper/reaper"
)

// failingStore fails the load of any batch naming loadFails, as
// PostgreSQL does when it is cut off in the middle of a pass, and the reap
// of reapFails alone, as when its own cascade fails (the reap of a pass
// spans its load batches, so failing the whole reap batch would take the
// other stalled job with it).
type failingStore struct {
	*pgstore.Store
	loadFails, reapFails string
}

func (s *failingStore) LoadForTasks(ctx context.Context, ids []string) (map[string]jobs.Snapshot, error) {
	if slices.Contains(ids, s.loadFails) {
		return nil, errors.New("conn closed")
	}
	return s.Store.LoadForTasks(ctx, ids)
}

func (s *failingStore) ReapBatch(ctx context.Context, p pgstore.ReapBatchParams) (pgstore.ReapBatchResult, error) {
	var failed []pgstore.ReapFailure
	p.Candidates = slices.DeleteFunc(slices.Clone(p.Candidates), func(c pgstore.ReapCandidate) bool {
		if c.JobID == s.reapFails {
			failed = append(failed, pgstore.ReapFailure{JobID: c.JobID, Err: errors.New("conn closed")})
			return true
		}
		return false
	})
	out, err := s.Store.ReapBatch(ctx, p)
	out.Failed = append(out.Failed, failed...)
	return out, err
}

// Every scanned active task lands in exactly one scanned_by reason, also
// those no skip reason names: an entry without a lease (reaped as
// lost_task, and counted as no_lease), an ID listed twice, a task of a
// batch that failed to load, a stalled job whose reap failed. The lost-task
// search's own outcomes (no_queue here) stay out of it, and skipped keeps
// its keys.
func TestScannedByAccountsForEveryScannedTask(t *testing.T) {
	t.Parallel()
	b := setup(t, func(o *reaper.Options) { o.Queues = []string{"a", "b"} })
	for _, id := range []string{"stalled", "nolease", "loadfails", "reapfails"} {
		b.db.Insert(t, jobstest.Job{ID: id, Type: "report.export", Generation: 1, Queue: "a",
			StartedAgo: jobstest.Ago(31 * time.Minute), IdleAgo: 21 * time.Minute})
	}
	b.db.Insert(t, jobstest.Job{ID: "running", Type: "report.export", Generation: 1, Queue: "a",
		StartedAgo: jobstest.Ago(5 * time.Minute), IdleAgo: time.Minute})
	// A stalled row without a queue: the lost-task search counts it as
	// no_queue in skipped; it was never scanned.
	b.db.Insert(t, jobstest.Job{ID: "noqueue", Type: "report.export", Generation: 1,
		StartedAgo: jobstest.Ago(31 * time.Minute), IdleAgo: 21 * time.Minute})
	b.lister.queues["a"] = asynqstate.ActiveTasks{IDs: []string{"stalled", "running", "running", "ghost", "loadfails", "reapfails"},
		EmptyIDs: 1, NoLease: []string{"nolease"}}
	b.lister.queues["b"] = asynqstate.ActiveTasks{IDs: []string{"stalled", "bad\x00id"}}
	store := &failingStore{Store: b.db.Daemon(), loadFails: "loadfails", reapFails: "reapfails"}
	r := reaper.New(store, b.lister, b.markers, reaper.Options{Rule: baselineRule, Logger: testLogger(t),
		Queues: []string{"a", "b"}, LoadBatch: 1})

	res, err := runOnce(t, t.Context(), r)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]int{"stalled": 1, "within_limit": 1, "no_row": 1, "no_job_id": 1, "bad_job_id": 1,
		"no_lease": 1, "duplicate": 2, "load_failed": 1, "reap_failed": 1}
	if res.Scanned != 10 || !equalCounts(res.ScannedBy, want) {
		t.Fatalf("scanned %d by %v, want 10 by %v", res.Scanned, res.ScannedBy, want)
	}
	if err := res.CheckScanned(); err != nil {
		t.Fatal(err)
	}
	if res.ReapedBy[jobs.ReasonStalled] != 1 || res.ReapedBy[jobs.ReasonLostTask] != 1 || res.Errors != 2 {
		t.Fatalf("pass = %+v; want stalled reaped as stalled, nolease as lost_task, 2 errors (a load, a reap)", res)
	}
	wantSkipped := map[string]int{"within_limit": 1, "no_row": 1, "no_job_id": 1, "bad_job_id": 1, "no_queue": 1}
	if !equalCounts(res.Skipped, wantSkipped) {
		t.Fatalf("skipped %v, want %v", res.Skipped, wantSkipped)
	}
}

// CheckScanned says how a summary does not add up, and lets an interrupted
// pass be.
func TestCheckScanned(t *testing.T) {
	t.Parallel()
	res := reaper.Result{Scanned: 5, ScannedBy: map[string]int{"stalled": 1, "no_row": 3}}
	err := res.CheckScanned()
	if err == nil || !strings.Contains(err.Error(), "scanned 5") || !strings.Contains(err.Error(), "4") {
		t.Fatalf("CheckScanned = %v, want an error naming scanned 5 and the sum 4", err)
	}
	res.Interrupted = true
	if err := res.CheckScanned(); err != nil {
		t.Fatalf("CheckScanned of an interrupted pass = %v, want nil", err)
	}
	if err := (reaper.Result{}).CheckScanned(); err != nil {
		t.Fatalf("CheckScanned of an empty pass = %v, want nil", err)
	}
}
