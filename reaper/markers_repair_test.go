package reaper_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/jobreaper/jobreaper/internal/asynqstate"
	"github.com/jobreaper/jobreaper/internal/pgstore"
	"github.com/jobreaper/jobreaper/queue"
	"github.com/jobreaper/jobreaper/reaper"
)

// roundTrips counts the round trips a Redis client makes, single commands
// and pipelines, apart from those that set a new connection up (HELLO,
// CLIENT SETINFO).
type roundTrips struct{ n atomic.Int64 }

func (h *roundTrips) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *roundTrips) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.count(cmd)
		return next(ctx, cmd)
	}
}

func (h *roundTrips) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if len(cmds) > 0 {
			h.count(cmds[0])
		}
		return next(ctx, cmds)
	}
}

func (h *roundTrips) count(first redis.Cmder) {
	if name := first.Name(); name != "hello" && name != "client" {
		h.n.Add(1)
	}
}

// markRecorder counts the statements that record written markers
// (MarkMarkersSet; the pass has no other way to record them).
type markRecorder struct {
	*pgstore.Store
	statements atomic.Int64
}

func (m *markRecorder) MarkMarkersSet(ctx context.Context, refs []pgstore.MarkerRef) error {
	m.statements.Add(1)
	return m.Store.MarkMarkersSet(ctx, refs)
}

// Redis was down when 300 jobs were reaped, so their marker writes failed.
// The first pass after Redis came back re-sets all 300 markers and records
// them in a few round trips (pipelines, one statement), not in two round
// trips per marker: found by the fault suite, where one Redis stop during
// a pass of 1,000 reaps held the daemon's first clean pass back by several
// seconds at a one-second interval, and a repair of the 500 markers a pass
// takes grows with the latency of both servers.
func TestMarkerRepairAfterAnOutageWritesInPipelines(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	const n = 300
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("J%03d", i)
		b.stalled(t, ids[i])
	}
	b.lister.queues["default"] = asynqstate.ActiveTasks{IDs: ids}
	down := reaper.New(b.db.Daemon(), b.lister, brokenMarkers{}, reaper.Options{Rule: baselineRule, Logger: testLogger(t)})
	if res, err := runOnce(t, ctx, down); err != nil || res.Reaped != n || res.Errors != n {
		t.Fatalf("pass while Redis is down = %+v, err %v; want %d reaped and %d marker errors", res, err, n, n)
	}

	rdb := redis.NewClient(&redis.Options{Addr: b.redis.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	trips := &roundTrips{}
	rdb.AddHook(trips)
	store := &markRecorder{Store: b.db.Daemon()}
	up := reaper.New(store, b.lister, newMarkers(t, rdb), reaper.Options{Rule: baselineRule, Logger: testLogger(t)})
	res, err := runOnce(t, ctx, up)
	if err != nil || res.Errors != 0 || res.MarkersRestored != n {
		t.Fatalf("pass after Redis came back = %+v, err %v; want %d markers restored, no error", res, err, n)
	}
	for _, id := range ids {
		if v, err := b.redis.Get(queue.MarkerKey(id)); err != nil || v != "1" {
			t.Fatalf("marker of %s = %q, %v; want generation 1", id, v, err)
		}
	}
	// One pipeline of compare-and-sets (sent again with the script's text
	// when Redis has not cached it) and one statement recording them.
	if got := trips.n.Load(); got > 2 {
		t.Errorf("%d Redis round trips to re-set %d markers, want them in one pipeline (2 round trips at most)", got, n)
	}
	if got := store.statements.Load(); got > 1 {
		t.Errorf("%d statements recorded %d re-set markers, want 1", got, n)
	}
	if n := b.db.Count(t, `SELECT count(*) FROM jobs WHERE marker_set_at IS NULL`); n != 0 {
		t.Errorf("%d re-set markers are not recorded as written", n)
	}
}
