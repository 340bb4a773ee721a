package reaper_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jobreaper/jobreaper/internal/asynqstate"
	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
	"github.com/jobreaper/jobreaper/queue"
	"github.com/jobreaper/jobreaper/reaper"
)

// reapedRow inserts id as a job reaped an hour ago at generation 2, its
// marker write confirmed or not.
func reapedRow(t *testing.T, db *jobstest.DB, id string, confirmed bool) {
	t.Helper()
	db.Insert(t, jobstest.Job{ID: id, Type: "report.export", Generation: 2, Queue: "default",
		StartedAgo: jobstest.Ago(2 * time.Hour), IdleAgo: time.Hour})
	db.Exec(t, `UPDATE jobs SET status = 'FAILED', failure_reason = 'stalled', finished_at = now() - interval '1 hour',
       marker_set_at = CASE WHEN $2 THEN now() - interval '1 hour' END WHERE id = $1`, id, confirmed)
}

// B46 in the reaper: while no live asynq server serves any queue of the
// pass in the Redis it reads, marker repair and re-assertion write
// nothing; the markers missing there are counted as held, and one warning
// names the Redis. The marker of a job reaped in the same pass is written
// all the same. Once a live server serves a queue of the pass, the next
// pass restores them. The live servers are read once per pass, for the
// markers and the lost-task search together.
func TestMarkerWritesAreHeldWhileNoLiveServerServesAQueueOfThePass(t *testing.T) {
	t.Parallel()
	logs := &logBuffer{}
	b := setup(t, func(o *reaper.Options) {
		o.Once, o.RedisName = true, "127.0.0.1:6379/8"
		o.Logger = slog.New(slog.NewTextHandler(io.MultiWriter(tWriter{t}, logs), nil))
	})
	reapedRow(t, b.db, "R1", false) // its write failed at the reap: repair
	reapedRow(t, b.db, "R2", true)  // written, then lost: re-assertion
	reapedRow(t, b.db, "R3", true)  // there
	if err := b.redis.Set(queue.MarkerKey("R3"), "2"); err != nil {
		t.Fatal(err)
	}
	b.stalled(t, "J1") // active: reaped as stalled in this pass
	b.db.Insert(t, jobstest.Job{ID: "L1", Type: "report.export", Generation: 1, Queue: "default",
		StartedAgo: jobstest.Ago(2 * time.Hour), IdleAgo: time.Hour}) // its task is gone: held as lost
	b.lister.queues["default"] = asynqstate.ActiveTasks{IDs: []string{"J1"}}
	b.lister.dead = map[string]bool{"default": true}

	res, err := runOnce(t, t.Context(), b.reaper)
	if err != nil || res.Errors != 0 || res.MarkersHeld != 2 || res.MarkersRestored != 0 || res.Reaped != 1 ||
		res.Skipped[string(reaper.SkipLostHeld)] != 1 {
		t.Fatalf("pass = %+v, %v; want markers_held 2, nothing restored, J1 reaped, L1 held, no error", res, err)
	}
	for _, id := range []string{"R1", "R2"} {
		if b.redis.Exists(queue.MarkerKey(id)) {
			t.Fatalf("the marker of %s was written while held", id)
		}
	}
	if v, err := b.redis.Get(queue.MarkerKey("J1")); err != nil || v != "1" {
		t.Fatalf("marker of J1, reaped in the pass = %q, %v; want generation 1", v, err)
	}
	if b.lister.liveCalls != 1 {
		t.Fatalf("the live servers were read %d times in the pass, want once", b.lister.liveCalls)
	}
	lines := logs.take()
	if n := countLines(lines, "level=WARN", "marker writes held", "redis=127.0.0.1:6379/8", "markers_held=2"); n != 1 {
		t.Fatalf("%d warnings naming the Redis and the held markers, want 1:\n%s", n, strings.Join(lines, "\n"))
	}
	if n := b.db.Count(t, `SELECT count(*) FROM jobs WHERE id = 'R1' AND marker_set_at IS NULL`); n != 1 {
		t.Fatal("R1's marker is recorded as written although it was held")
	}

	// A worker starts: a live server serves the queue.
	b.lister.dead = nil
	res, err = runOnce(t, t.Context(), b.reaper)
	if err != nil || res.Errors != 0 || res.MarkersHeld != 0 || res.MarkersRestored != 2 {
		t.Fatalf("pass with a live server = %+v, %v; want markers_restored 2 and none held", res, err)
	}
	for _, id := range []string{"R1", "R2", "R3"} {
		if v, err := b.redis.Get(queue.MarkerKey(id)); err != nil || v != "2" {
			t.Fatalf("marker of %s = %q, %v; want generation 2", id, v, err)
		}
	}
}

// Workers scaled to zero at night: no live server, but every marker is
// there, so nothing is held: a warning, no count, no error.
func TestMarkerHoldWithNothingMissingOnlyWarns(t *testing.T) {
	t.Parallel()
	logs := &logBuffer{}
	b := setup(t, func(o *reaper.Options) {
		o.Once = true
		o.Logger = slog.New(slog.NewTextHandler(io.MultiWriter(tWriter{t}, logs), nil))
	})
	reapedRow(t, b.db, "R3", true)
	if err := b.redis.Set(queue.MarkerKey("R3"), "2"); err != nil {
		t.Fatal(err)
	}
	b.lister.queues["default"] = asynqstate.ActiveTasks{}
	b.lister.dead = map[string]bool{"default": true}
	res, err := runOnce(t, t.Context(), b.reaper)
	if err != nil || res.Errors != 0 || res.MarkersHeld != 0 || res.MarkersRestored != 0 {
		t.Fatalf("pass = %+v, %v; want nothing held, nothing restored, no error", res, err)
	}
	if n := countLines(logs.take(), "level=WARN", "marker writes held", "none was missing"); n != 1 {
		t.Fatalf("%d warnings saying the hold found nothing missing, want 1", n)
	}
	if ttl := b.redis.TTL(queue.MarkerKey("R3")); ttl != 0 {
		t.Fatalf("R3's marker got a TTL (%v): it was written", ttl)
	}
	if n := b.db.Count(t, `SELECT count(*) FROM jobs WHERE status = $1`, jobs.StatusFailed); n != 1 {
		t.Fatalf("%d FAILED jobs, want R3 only", n)
	}
}

// A queue asynq does not know gets a did-you-mean among the queues it
// knows in that Redis, from Options.Suggest.
func TestUnknownQueueGetsADidYouMean(t *testing.T) {
	t.Parallel()
	logs := &logBuffer{}
	b := setup(t, func(o *reaper.Options) {
		o.Queues = []string{"reprots", "zzz"}
		o.Suggest = func(name string, known []string) string {
			if name == "reprots" && len(known) == 2 {
				return "reports"
			}
			return ""
		}
		o.Logger = slog.New(slog.NewTextHandler(io.MultiWriter(tWriter{t}, logs), nil))
	})
	b.lister.queues["reports"] = asynqstate.ActiveTasks{}
	b.lister.queues["other"] = asynqstate.ActiveTasks{}
	res, err := runOnce(t, t.Context(), b.reaper)
	if err != nil || strings.Join(res.QueuesNotFound, ",") != "reprots,zzz" || len(res.QueueSuggestions) != 1 ||
		res.QueueSuggestions["reprots"] != "reports" {
		t.Fatalf("pass = %+v, %v; want both not found, reprots with the did-you-mean reports", res, err)
	}
	lines := logs.take()
	if countLines(lines, "level=WARN", "queue=reprots", "did_you_mean=reports") != 1 || countLines(lines, "level=WARN", "queue=zzz") != 1 {
		t.Fatalf("want one warning per unknown queue, the did-you-mean in reprots's:\n%s", strings.Join(lines, "\n"))
	}
}

// liveFails answers task lookups as its lister does and fails every read
// of the live servers, as a Redis that times out on it.
type liveFails struct{ *fakeLister }

func (liveFails) LiveQueues(context.Context) (map[string]bool, error) {
	return nil, errors.New("i/o timeout")
}

// A failed read of the live servers holds the marker writes and judges no
// lost task, and is one error of the pass, not one per asker.
func TestLiveServersThatCannotBeReadHoldMarkersAndCountOneError(t *testing.T) {
	t.Parallel()
	b := setup(t, func(o *reaper.Options) { o.Once = true })
	reapedRow(t, b.db, "R1", false)
	b.db.Insert(t, jobstest.Job{ID: "L1", Type: "report.export", Generation: 1, Queue: "default",
		StartedAgo: jobstest.Ago(2 * time.Hour), IdleAgo: time.Hour})
	b.lister.queues["default"] = asynqstate.ActiveTasks{}
	r := reaper.New(b.db.Daemon(), b.lister, b.markers, reaper.Options{Rule: baselineRule, Logger: testLogger(t), Once: true,
		Asynq: liveFails{b.lister}})
	res, err := runOnce(t, t.Context(), r)
	if err != nil || res.Errors != 1 || res.MarkersHeld != 1 || res.Reaped != 0 {
		t.Fatalf("pass = %+v, %v; want one error, R1's marker held, nothing reaped", res, err)
	}
	if b.redis.Exists(queue.MarkerKey("R1")) {
		t.Fatal("R1's marker was written although the live servers could not be read")
	}
	if row := b.db.Read(t, "L1"); row.Status != jobs.StatusProcessing {
		t.Fatalf("L1 = %+v, want PROCESSING", row)
	}
}
