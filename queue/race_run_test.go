package queue_test

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"pgregory.net/rapid"

	"github.com/jobreaper/jobreaper/jobs/jobstest"
	"github.com/jobreaper/jobreaper/queue/queuetest"
	"github.com/jobreaper/jobreaper/reaper"
)

// outcome is what one interleaving's checks found.
type outcome struct {
	n          int64
	violations []string
	// lost counts rows that should exist and do not: job rows, items of
	// recorded batches, chapters of completed courses, and jobs left
	// PROCESSING after a clean pass.
	lost int
	log  string
}

// interleave runs plan p once on fresh job IDs and checks it.
func (s *raceSuite) interleave(rt *rapid.T, p racePlan) outcome {
	ctx := context.Background()
	n := s.next.Add(1)
	logs := &jobstest.SyncBuffer{}
	r := &raceRun{s: s, n: n, plan: p, rec: newRecords(), log: slog.New(slog.NewTextHandler(logs, nil))}
	for _, j := range p.jobs {
		r.ids = append(r.ids, fmt.Sprintf("r%d-%s", n, j.flow))
	}
	if err := r.insert(ctx); err != nil {
		rt.Fatalf("inserting the jobs of interleaving %d: %v", n, err)
	}
	// The active list holds this interleaving's tasks only, so that each
	// pass lists and loads three rows however many interleavings ran.
	if err := queuetest.Remove(ctx, s.rc, raceQueue); err != nil {
		rt.Fatalf("removing the tasks of the interleaving before %d: %v", n, err)
	}
	if err := queuetest.MakeActive(ctx, s.rc, raceQueue, "race", r.ids); err != nil {
		rt.Fatalf("making the tasks of interleaving %d active: %v", n, err)
	}

	r.race(ctx)
	// A clean pass once every goroutine ended and the stall timeout
	// elapsed (the rule's time passing, not a wait for an effect): it
	// must reap whatever is still PROCESSING, and it re-sets the markers
	// whose writes failed.
	time.Sleep(p.stall)
	r.pass(ctx, passPlan{})
	r.check(ctx)
	return outcome{n: n, violations: r.rec.violations, lost: r.rec.lost, log: logs.String()}
}

// raceRun is one interleaving.
type raceRun struct {
	s    *raceSuite
	n    int64
	plan racePlan
	ids  []string
	rec  *records
	log  *slog.Logger
}

// insert creates the interleaving's jobs (QUEUED, in raceQueue) and their
// parents: a course and a video.
func (r *raceRun) insert(ctx context.Context) error {
	b := &pgx.Batch{}
	b.Queue(`INSERT INTO courses (id) VALUES ($1)`, r.parent(flowCourse))
	b.Queue(`INSERT INTO videos (id) VALUES ($1)`, r.parent(flowVideo))
	for i, j := range r.plan.jobs {
		b.Queue(`INSERT INTO jobs (id, type, status, queue, parent_id, tenant_id, total) VALUES ($1, $2, 'QUEUED', $3, nullif($4, ''), 't1', $5)`,
			r.ids[i], j.flow.jobType(), raceQueue, r.parent(j.flow), j.total)
	}
	return r.s.wide.Pool.SendBatch(ctx, b).Close()
}

// parent returns the product row f's job belongs to ("" for a batch).
func (r *raceRun) parent(f flow) string {
	switch f {
	case flowCourse:
		return fmt.Sprintf("r%d-c", r.n)
	case flowVideo:
		return fmt.Sprintf("r%d-v", r.n)
	}
	return ""
}

// race runs the plan's goroutines, released together, and a sampler of
// the jobs' cursors until they all ended.
func (r *raceRun) race(ctx context.Context) {
	var (
		wg   sync.WaitGroup
		gate = make(chan struct{})
	)
	goAfterGate := func(fn func()) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-gate
			fn()
		}()
	}
	for i, j := range r.plan.jobs {
		id := r.ids[i]
		for _, a := range j.attempts {
			goAfterGate(func() { r.attempt(ctx, id, j, a) })
		}
		if j.requeue != nil {
			goAfterGate(func() { r.requeue(ctx, id, *j.requeue) })
		}
		if j.relife != nil {
			goAfterGate(func() { r.relife(ctx, i, *j.relife) })
		}
	}
	for _, ps := range r.plan.passes {
		goAfterGate(func() { r.pass(ctx, ps) })
	}
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		r.sampleCursors(ctx, stop)
	}()
	close(gate)
	wg.Wait()
	close(stop)
	<-sampled
}

// pass runs one pass of the reaper over raceQueue, as the daemon does,
// with marker writes that fail when ps says so.
func (r *raceRun) pass(ctx context.Context, ps passPlan) {
	ps.before.wait()
	var m reaper.Markers = r.s.writer
	if ps.markersFail {
		m = &failingMarkers{rec: r.rec}
	}
	rp := reaper.New(r.s.daemon, r.s.lister, m, reaper.Options{
		Queues: []string{raceQueue, raceLiveQueue}, Rule: raceRule(r.plan.stall), Logger: r.log, Asynq: r.s.asynq,
	})
	res, err := rp.RunOnce(ctx)
	r.rec.mu.Lock()
	defer r.rec.mu.Unlock()
	r.rec.passReaped += res.Reaped
	switch {
	case err != nil:
		r.rec.violate("a reaper pass could not run: %v", err)
	case res.Errors > 0 && !ps.markersFail:
		r.rec.violate("a reaper pass with a working Redis counted %d errors: %+v", res.Errors, res)
	}
	if cerr := res.CheckScanned(); cerr != nil {
		r.rec.violate("a reaper pass's summary does not add up: %v", cerr)
	}
}

// sampleCursors reads the jobs' cursors until stop is closed: within one
// life of an ID the cursor never moves backwards and never passes the
// total. The pause between samples paces the polling; nothing waits on it.
func (r *raceRun) sampleCursors(ctx context.Context, stop <-chan struct{}) {
	type seen struct{ life, cursor int64 }
	last := map[string]seen{}
	for {
		select {
		case <-stop:
			return
		default:
		}
		rows, err := r.s.wide.Pool.Query(ctx, `SELECT id, first_generation, "cursor", total FROM jobs WHERE id = ANY($1)`, r.ids)
		if err != nil {
			r.rec.lockedViolate("sampling cursors: %v", err)
			return
		}
		for rows.Next() {
			var (
				id           string
				life, cursor int64
				total        *int64
			)
			if err := rows.Scan(&id, &life, &cursor, &total); err != nil {
				r.rec.lockedViolate("sampling cursors: %v", err)
				break
			}
			if total != nil && cursor > *total {
				r.rec.lockedViolate("cursor of %s is %d, past its total %d", id, cursor, *total)
			}
			if prev, ok := last[id]; ok && (life < prev.life || life == prev.life && cursor < prev.cursor) {
				r.rec.lockedViolate("cursor of %s moved backwards: life %d cursor %d, then life %d cursor %d",
					id, prev.life, prev.cursor, life, cursor)
			}
			last[id] = seen{life, cursor}
		}
		rows.Close()
		time.Sleep(300 * time.Microsecond)
	}
}
