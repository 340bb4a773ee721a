package reaper_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jobreaper/jobreaper/internal/asynqstate"
	"github.com/jobreaper/jobreaper/internal/pgstore"
	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
	"github.com/jobreaper/jobreaper/reaper"
)

// loadCountingStore counts how often each ID is loaded.
type loadCountingStore struct {
	*pgstore.Store
	mu    sync.Mutex
	loads map[string]int
}

func (s *loadCountingStore) LoadForTasks(ctx context.Context, ids []string) (map[string]jobs.Snapshot, error) {
	s.mu.Lock()
	for _, id := range ids {
		s.loads[id]++
	}
	s.mu.Unlock()
	return s.Store.LoadForTasks(ctx, ids)
}

// An ID listed twice (in two queues, and twice within one list) is loaded
// and judged once, also when its copies fall in different load batches:
// the stalled job is reaped once and not then counted as changed since
// the read, the running one is one within_limit skip, the task without a
// row one no_row skip.
func TestAnIDListedTwiceIsLoadedAndJudgedOnce(t *testing.T) {
	t.Parallel()
	for _, batch := range []int{1, 2, 3, 1000} {
		b := setup(t)
		b.stalled(t, "J1")
		b.db.Insert(t, jobstest.Job{ID: "J2", Type: "report.export", Generation: 1, Queue: "a",
			StartedAgo: jobstest.Ago(5 * time.Minute), IdleAgo: time.Minute})
		b.lister.queues["a"] = asynqstate.ActiveTasks{IDs: []string{"J1", "J2", "J2"}}
		b.lister.queues["b"] = asynqstate.ActiveTasks{IDs: []string{"J3", "J2", "J1"}}
		store := &loadCountingStore{Store: b.db.Daemon(), loads: map[string]int{}}
		r := reaper.New(store, b.lister, b.markers, reaper.Options{Rule: baselineRule, Logger: testLogger(t),
			Queues: []string{"a", "b"}, LoadBatch: batch})
		res, err := runOnce(t, context.Background(), r)
		if err != nil || res.Reaped != 1 || res.Skipped[string(reaper.SkipWithinLimit)] != 1 || res.Skipped[string(reaper.SkipNoRow)] != 1 ||
			res.Skipped[string(reaper.SkipChangedSinceRead)] != 0 || res.Errors != 0 {
			t.Fatalf("load batch %d: pass = %+v, %v; want J1 reaped once, J2 within_limit once, J3 no_row once", batch, res, err)
		}
		for _, id := range []string{"J1", "J2", "J3"} {
			if store.loads[id] != 1 {
				t.Fatalf("load batch %d: %s loaded %d times, want once (loads %v)", batch, id, store.loads[id], store.loads)
			}
		}
		if got := b.db.Count(t, `SELECT count(*) FROM job_events WHERE job_id = 'J1' AND kind = 'reaped'`); got != 1 {
			t.Fatalf("load batch %d: %d reaped events for J1, want 1", batch, got)
		}
	}
}

// The loaded IDs stay sorted and each once whatever order the batches
// come in, so that a copy listed out of order is still found: each job
// is loaded once and reaped once, and none is taken for lost (the
// lost-task search reads the loaded IDs as the active set).
func TestCopiesListedOutOfOrderAreLoadedOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	listed := []string{"J5", "J1", "J9", "J3", "J7", "J1", "J5", "J9", "J3", "J7", "J2"}
	for _, id := range []string{"J1", "J2", "J3", "J5", "J7", "J9"} {
		b.stalled(t, id)
	}
	b.lister.queues["default"] = asynqstate.ActiveTasks{IDs: listed}
	store := &loadCountingStore{Store: b.db.Daemon(), loads: map[string]int{}}
	r := reaper.New(store, b.lister, b.markers, reaper.Options{Rule: baselineRule, Logger: testLogger(t), LoadBatch: 2})
	res, err := runOnce(t, context.Background(), r)
	if err != nil || res.Reaped != 6 || res.ReapedBy["stalled"] != 6 || res.ReapedBy["lost_task"] != 0 || res.Errors != 0 {
		t.Fatalf("pass = %+v, %v; want the 6 jobs reaped as stalled", res, err)
	}
	for id, n := range store.loads {
		if n != 1 {
			t.Fatalf("%s loaded %d times, want once (loads %v)", id, n, store.loads)
		}
	}
	if len(store.loads) != 6 {
		t.Fatalf("loads %v, want the 6 IDs once each", store.loads)
	}
}
