package queue_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/jobreaper/jobreaper/internal/asynqstate"
	"github.com/jobreaper/jobreaper/internal/pgstore"
	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
	"github.com/jobreaper/jobreaper/queue"
)

// The goroutines of one interleaving: attempts through the start guard,
// the operator's requeue and the product's second life of an ID. Each
// records in records what the product's API answered, so that the checks
// can hold every answer against what landed in the database.

// attemptRef names one attempt: a job and the generation its claim gave it.
type attemptRef struct {
	job string
	gen int64
}

type batchRef struct {
	job   string
	gen   int64
	token string
}

type beatRef struct {
	job       string
	gen, mark int64
}

// records is what the goroutines of one interleaving were told.
type records struct {
	mu         sync.Mutex
	violations []string
	lost       int
	// handlers counts the handler runs the guard started, per attempt.
	handlers map[attemptRef]int
	// completed: a completion of the attempt was confirmed (committed or
	// replayed).
	completed map[attemptRef]bool
	// charged counts the usage charges ComposeVideo reported, per job.
	charged map[string]int
	// batches: Advance recorded the batch (not a replay).
	batches map[batchRef]bool
	// failed and released: Fail (with its code) and Release succeeded.
	failed   map[attemptRef]string
	released map[attemptRef]bool
	// beats: Heartbeat wrote the mark.
	beats map[beatRef]bool
	// markerWritesFailed: the marker writes a pass with failing marker
	// writes tried (by job and generation).
	markerWritesFailed map[attemptRef]bool
	passReaped         int
	relives            int
	replays            int
	guardReaped        int
}

func newRecords() *records {
	return &records{
		handlers: map[attemptRef]int{}, completed: map[attemptRef]bool{}, charged: map[string]int{},
		batches: map[batchRef]bool{}, failed: map[attemptRef]string{}, released: map[attemptRef]bool{},
		beats: map[beatRef]bool{}, markerWritesFailed: map[attemptRef]bool{},
	}
}

// violate records a violation; rec.mu is held.
func (rec *records) violate(format string, args ...any) {
	rec.violations = append(rec.violations, fmt.Sprintf(format, args...))
}

func (rec *records) lockedViolate(format string, args ...any) {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	rec.violate(format, args...)
}

func (rec *records) note(fn func()) {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	fn()
}

// failingMarkers fails every marker write, as Redis does when it goes away
// after the reap committed, and records which reaps' writes it refused: the
// reap writes its marker with the whole queue.MarkerTTL, a repair or a
// re-assertion with what is left of it.
type failingMarkers struct{ rec *records }

var errRedisDown = errors.New("redis: connection refused")

func (f *failingMarkers) Set(_ context.Context, jobID string, generation int64, ttl time.Duration) (bool, error) {
	f.failed(asynqstate.MarkerWrite{JobID: jobID, Generation: generation, TTL: ttl})
	return false, errRedisDown
}

func (f *failingMarkers) SetMany(_ context.Context, writes []asynqstate.MarkerWrite) []asynqstate.MarkerResult {
	out := make([]asynqstate.MarkerResult, len(writes))
	for i, w := range writes {
		f.failed(w)
		out[i].Err = errRedisDown
	}
	return out
}

func (f *failingMarkers) failed(w asynqstate.MarkerWrite) {
	if w.TTL == queue.MarkerTTL {
		f.rec.note(func() { f.rec.markerWritesFailed[attemptRef{w.JobID, w.Generation}] = true })
	}
}

// fenced reports whether err is a fencing refusal: the attempt was
// superseded or the job ended.
func fenced(err error) bool {
	return errors.Is(err, jobs.ErrStaleWorker) || errors.Is(err, jobs.ErrJobTerminal)
}

func (rt ret) err() error {
	switch rt {
	case retRetryable:
		return errors.New("race: a retryable error")
	case retSkipRetry:
		return fmt.Errorf("race: a permanent error: %w", asynq.SkipRetry)
	case retCoded:
		return queue.Failure("race_coded", fmt.Errorf("race: a permanent error with a code: %w", asynq.SkipRetry))
	case retRevoke:
		return asynq.RevokeTask
	}
	return nil
}

// attempt delivers job id's task to worker a.worker through the start
// guard; a handler that runs does a's steps and returns a.ret; after the
// guard returned, an attempt that ran goes on with a's late steps on its
// lease.
func (r *raceRun) attempt(ctx context.Context, id string, j jobPlan, a attemptPlan) {
	a.before.wait()
	w := &worker{r: r, flow: j.flow, total: j.total, hb: r.s.hbs[a.worker]}
	guard := queue.NewGuardForTest(r.s.store, r.s.markers,
		queue.WithWorker(fmt.Sprintf("w%d", a.worker)), queue.WithLogger(r.log))
	ran := false
	h := asynq.HandlerFunc(func(ctx context.Context, _ *asynq.Task) error {
		lease, err := jobs.LeaseFromContext(ctx)
		if err != nil {
			r.rec.lockedViolate("the guard ran the handler of %s without a lease: %v", id, err)
			return err
		}
		ran = true
		w.lease, w.cursor, w.mark = lease, lease.Cursor, 1
		r.rec.note(func() { r.rec.handlers[attemptRef{id, lease.Generation}]++ })
		for _, st := range a.steps {
			if err := w.do(ctx, st); err != nil && a.stopOnError {
				return err
			}
		}
		return a.ret.err()
	})
	err := queue.Deliver(ctx, guard, id, h)
	switch {
	case errors.Is(err, queue.ErrGuardUnavailable):
		r.rec.lockedViolate("the guard could not decide on %s although PostgreSQL and Redis are up: %v", id, err)
	case !ran && errors.Is(err, queue.ErrJobReaped):
		r.rec.note(func() { r.rec.guardReaped++ })
	}
	if !ran {
		return
	}
	for _, st := range a.late {
		_ = w.do(ctx, st)
	}
}

// worker is one attempt's handler state.
type worker struct {
	r     *raceRun
	flow  flow
	total int64
	hb    *jobs.Heartbeater
	lease jobs.Lease
	// cursor is where the attempt believes the job's cursor stands; mark
	// is the last heartbeat mark's offset within the generation.
	cursor, mark int64
	// written is the last mark a heartbeat of this attempt wrote.
	written int64
}

// do runs one step and returns the error the product's API answered. An
// answer the API must never give is recorded as a violation.
func (w *worker) do(ctx context.Context, st step) error {
	st.before.wait()
	rec, l := w.r.rec, w.lease
	ref := attemptRef{l.JobID, l.Generation}
	unexpected := func(err error) error {
		rec.lockedViolate("%s of %s answered %v", st.op, l.FencingToken(), err)
		return err
	}
	switch st.op {
	case opHeartbeat:
		w.mark += int64(st.arg) // arg 0: an idle ticker repeats its mark
		mark := l.Generation*1000 + w.mark
		res, err := w.hb.Heartbeat(ctx, l, mark)
		switch {
		case err == nil && res.Written:
			w.written = mark
			rec.note(func() { rec.beats[beatRef{l.JobID, l.Generation, mark}] = true })
		case err == nil && !res.Throttled && mark > w.written:
			// B36: an advancing mark that wrote nothing must say why.
			return unexpected(fmt.Errorf("mark %d past the attempt's last written %d wrote nothing and returned no error", mark, w.written))
		case err != nil && !fenced(err):
			return unexpected(err)
		}
		return err

	case opAdvance:
		token := fmt.Sprintf("b%d", w.cursor)
		res, err := jobstest.Batch(ctx, w.r.s.store, w.r.s.wide, l, token, w.cursor, 1)
		switch {
		case err == nil && !res.Replayed && res.Cursor == w.cursor+1 && res.Generation == l.Generation:
			w.cursor = res.Cursor
			rec.note(func() { rec.batches[batchRef{l.JobID, l.Generation, token}] = true })
		case err == nil:
			return unexpected(fmt.Errorf("a new batch %s at cursor %d answered %+v", token, w.cursor, res))
		case errors.Is(err, jobs.ErrOutOfRange) && w.cursor >= w.total:
		case !fenced(err):
			return unexpected(err)
		}
		return err

	case opReplay:
		if w.cursor == 0 {
			return nil // nothing recorded in this life yet
		}
		k := int64(st.arg) % w.cursor
		res, err := jobstest.Batch(ctx, w.r.s.store, w.r.s.wide, l, fmt.Sprintf("b%d", k), k, 1)
		switch {
		case err == nil && res.Replayed && res.Cursor == k+1:
			rec.note(func() { rec.replays++ })
		case err == nil:
			return unexpected(fmt.Errorf("batch b%d of this life sent again answered %+v, not a replay", k, res))
		case !errors.Is(err, jobs.ErrStaleWorker):
			// A recorded token stays readable by its own generation even
			// after the job ended; only a newer generation refuses it.
			return unexpected(err)
		}
		return err

	case opComplete:
		return w.complete(ctx, st, ref, unexpected)

	case opFail:
		code := fmt.Sprintf("failed_g%d", l.Generation)
		err := w.r.s.store.Fail(ctx, l, code)
		switch {
		case err == nil:
			rec.note(func() { rec.failed[ref] = code })
		case !fenced(err):
			return unexpected(err)
		}
		return err

	case opHang:
		time.Sleep(time.Duration(hangMicros[st.arg]) * time.Microsecond)
		return nil

	case opRelease:
		err := w.r.s.store.Release(ctx, l)
		switch {
		case err == nil:
			rec.note(func() { rec.released[ref] = true })
		case !fenced(err):
			return unexpected(err)
		}
		return err
	}
	return nil
}

// complete runs the flow's completion.
func (w *worker) complete(ctx context.Context, st step, ref attemptRef, unexpected func(error) error) error {
	rec, l, s := w.r.rec, w.lease, w.r.s
	var (
		err       error
		completed bool
	)
	switch w.flow {
	case flowCourse:
		_, err = jobstest.AddChapters(ctx, s.store, s.wide, l)
		completed = err == nil
	case flowVideo:
		bad := st.arg == 2
		var charged bool
		charged, err = jobstest.ComposeVideo(ctx, s.store, s.wide, l, bad)
		var pgErr *pgconn.PgError
		badMetadata := bad && errors.As(err, &pgErr) && pgErr.Code == "23514" // the duration's CHECK
		completed = err == nil || badMetadata
		if charged {
			rec.note(func() { rec.charged[l.JobID]++ })
		}
		if badMetadata {
			err = nil
		}
	case flowBatch:
		_, err = s.store.CompleteWith(ctx, s.wide.Pool, l, nil)
		completed = err == nil
	}
	if completed {
		rec.note(func() { rec.completed[ref] = true })
	}
	if err != nil && !fenced(err) {
		return unexpected(err)
	}
	return err
}

// requeue is the operator's `jobreaper requeue` of a FAILED job, after d.
func (r *raceRun) requeue(ctx context.Context, id string, d jitter) {
	d.wait()
	sn, err := r.s.store.Get(ctx, id)
	if err != nil {
		r.rec.lockedViolate("reading %s to requeue it: %v", id, err)
		return
	}
	if sn.Status != jobs.StatusFailed {
		return
	}
	_, err = r.s.daemon.Requeue(ctx, pgstore.RequeueParams{JobID: id, Status: sn.Status, Generation: sn.Generation, Reason: "race suite"})
	if err != nil && !errors.Is(err, pgstore.ErrChangedSinceRead) {
		r.rec.lockedViolate("requeueing %s: %v", id, err)
	}
}

// relife is the product running job i again (B32) after d, if it ended:
// in one transaction it deletes the job's row and its product rows and
// inserts the ID again, QUEUED, with its total.
func (r *raceRun) relife(ctx context.Context, i int, d jitter) {
	d.wait()
	id, j := r.ids[i], r.plan.jobs[i]
	err := pgx.BeginFunc(ctx, r.s.wide.Pool, func(tx pgx.Tx) error {
		var status string
		if err := tx.QueryRow(ctx, `SELECT status FROM jobs WHERE id = $1 FOR UPDATE`, id).Scan(&status); err != nil {
			return err
		}
		if status != jobs.StatusCompleted && status != jobs.StatusFailed {
			return nil
		}
		parent := r.parent(j.flow)
		for _, st := range []struct {
			sql  string
			args []any
		}{
			{`DELETE FROM lectures WHERE lesson_id IN (SELECT l.id FROM lessons l JOIN chapters c ON c.id = l.chapter_id WHERE c.job_id = $1)`, []any{id}},
			{`DELETE FROM lessons WHERE chapter_id IN (SELECT id FROM chapters WHERE job_id = $1)`, []any{id}},
			{`DELETE FROM chapters WHERE job_id = $1`, []any{id}},
			{`UPDATE courses SET chapter_count = 0 WHERE id = $1`, []any{parent}},
			{`DELETE FROM items WHERE job_id = $1`, []any{id}},
			{`DELETE FROM jobs WHERE id = $1`, []any{id}},
		} {
			if _, err := tx.Exec(ctx, st.sql, st.args...); err != nil {
				return err
			}
		}
		if _, err := tx.Exec(ctx, `INSERT INTO jobs (id, type, status, queue, parent_id, tenant_id, total) VALUES ($1, $2, 'QUEUED', $3, nullif($4, ''), 't1', $5)`,
			id, j.flow.jobType(), raceQueue, parent, j.total); err != nil {
			return err
		}
		r.rec.note(func() { r.rec.relives++ })
		return nil
	})
	if err != nil {
		r.rec.lockedViolate("starting a second life of %s: %v", id, err)
	}
}
