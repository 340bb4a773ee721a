package demo

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/jobreaper/jobreaper/jobs"
)

// The progressing handler's work: a step every 250ms, 24 steps, so it runs
// about 6s, longer than max_runtime + stall timeout (5s): only its
// heartbeats can keep it from being reaped.
const (
	progressStep  = 250 * time.Millisecond
	progressSteps = 24
)

// courseFailsAt is the cursor at which the course flow's first attempt
// fails: after lessons 1 and 2.
const courseFailsAt = 2

// errLessonService is the course flow's first attempt failing: an error
// asynq retries.
var errLessonService = errors.New("lesson service unavailable (connection reset)")

// lateResult is what the hung handler got when its call finally returned
// and it tried to complete the job.
type lateResult struct {
	err error
	at  time.Time
}

// progressReport is what the progressing handler did.
type progressReport struct {
	calls, written, throttled int
	mark                      int64
	completeErr               error
	done                      bool
}

// courseAttempt is one attempt of the course flow.
type courseAttempt struct {
	generation, startCursor, endCursor int64
	// replayToken and replay are the batch re-sent at the start of a
	// resumed attempt.
	replayToken string
	replay      *jobs.AdvanceResult
	// tokens are the batches this attempt recorded.
	tokens    []string
	err       error
	completed bool
}

// handlers are the story's task handlers. They run behind the start guard
// and record what they did for the story to check.
type handlers struct {
	store *jobs.Store
	pool  *pgxpool.Pool
	hb    *jobs.Heartbeater

	// release is closed when the hung handler's call returns.
	release     chan struct{}
	releaseOnce sync.Once
	// late receives the hung handler's late completion.
	late chan lateResult
	// running counts tasks in flight through the whole middleware chain
	// (the guard's outcome mapping writes after the handler returns), so
	// cleanup can wait for every write before it drops the schema.
	running sync.WaitGroup

	mu       sync.Mutex
	runs     map[string]int // "<worker>/<job id>" -> handler runs
	finished map[string]error
	progress progressReport
	course   []courseAttempt
}

func newHandlers(store *jobs.Store, pool *pgxpool.Pool, hb *jobs.Heartbeater) *handlers {
	return &handlers{
		store: store, pool: pool, hb: hb,
		release:  make(chan struct{}),
		late:     make(chan lateResult, 2),
		runs:     map[string]int{},
		finished: map[string]error{},
	}
}

// register installs the handlers on mux for the worker named worker.
func (h *handlers) register(mux *asynq.ServeMux, worker string) {
	mux.HandleFunc(typeHung, h.wrap(worker, h.hung))
	mux.HandleFunc(typeProgress, h.wrap(worker, h.progressing))
	mux.HandleFunc(typeFinish, h.wrap(worker, h.finish))
	mux.HandleFunc(typeCourse, h.wrap(worker, h.courseFlow))
}

// wrap counts the handler's runs per worker and job, and hands it the
// lease the start guard put into ctx.
func (h *handlers) wrap(worker string, fn func(context.Context, jobs.Lease) error) asynq.HandlerFunc {
	return func(ctx context.Context, _ *asynq.Task) error {
		id, _ := asynq.GetTaskID(ctx)
		h.mu.Lock()
		h.runs[worker+"/"+id]++
		h.mu.Unlock()
		lease, err := jobs.LeaseFromContext(ctx)
		if err != nil {
			return err
		}
		return fn(ctx, lease)
	}
}

// track is the outermost middleware: it counts the task in running until
// the guard's outcome mapping has written too.
func (h *handlers) track(next asynq.Handler) asynq.Handler {
	return asynq.HandlerFunc(func(ctx context.Context, t *asynq.Task) error {
		h.running.Add(1)
		defer h.running.Done()
		return next.ProcessTask(ctx, t)
	})
}

// runsOn returns how often worker ran the handler of job id.
func (h *handlers) runsOn(worker, id string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.runs[worker+"/"+id]
}

// releaseHung lets the hung handler's call return.
func (h *handlers) releaseHung() { h.releaseOnce.Do(func() { close(h.release) }) }

// wait waits up to timeout for the running handlers; false when some
// still run.
func (h *handlers) wait(timeout time.Duration) bool {
	done := make(chan struct{})
	go func() {
		h.running.Wait()
		close(done)
	}()
	select {
	case <-done:
		return true
	case <-time.After(timeout):
		return false
	}
}

// hung blocks on a call that ignores ctx (a stuck socket read, a deadlock)
// and makes no progress. When the call finally returns, the handler does
// what such handlers do: it completes the job, writing its report row in
// the same transaction.
func (h *handlers) hung(ctx context.Context, lease jobs.Lease) error {
	<-h.release
	// asynq cancelled ctx when its worker gave up on the handler. The late
	// write runs on a context without that cancellation, as deferred and
	// error-path writes often do, so that what refuses it is the fence.
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	_, err := h.store.CompleteWith(wctx, h.pool, lease, func(tx pgx.Tx) error {
		return h.writeReport(wctx, tx, lease, "report of the hung call")
	})
	select {
	case h.late <- lateResult{err: err, at: time.Now()}:
	default:
	}
	return err
}

// progressing works in steps past its max_runtime and reports each step
// through the Heartbeater (an advancing progress mark; the 1s limiter lets
// one write a second through), then completes through CompleteWith.
func (h *handlers) progressing(ctx context.Context, lease jobs.Lease) error {
	tick := time.NewTicker(progressStep)
	defer tick.Stop()
	for mark := int64(1); mark <= progressSteps; mark++ {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
		res, err := h.hb.Heartbeat(ctx, lease, mark)
		h.mu.Lock()
		h.progress.calls++
		h.progress.mark = mark
		if res.Written {
			h.progress.written++
		}
		if res.Throttled {
			h.progress.throttled++
		}
		h.mu.Unlock()
		if err != nil {
			return err
		}
	}
	_, err := h.store.CompleteWith(ctx, h.pool, lease, func(tx pgx.Tx) error {
		return h.writeReport(ctx, tx, lease, fmt.Sprintf("report after %d steps", progressSteps))
	})
	h.mu.Lock()
	h.progress.done, h.progress.completeErr = true, err
	h.mu.Unlock()
	return err
}

// finish completes at once, well within its limit.
func (h *handlers) finish(ctx context.Context, lease jobs.Lease) error {
	_, err := h.store.CompleteWith(ctx, h.pool, lease, func(tx pgx.Tx) error {
		return h.writeReport(ctx, tx, lease, "quick report")
	})
	h.mu.Lock()
	h.finished[lease.JobID] = err
	h.mu.Unlock()
	return err
}

// courseFlow publishes a course's lessons one batch each through Advance,
// resuming at the lease's cursor. The first attempt fails after lesson 2.
// A resumed attempt does not know whether the batch in flight when the
// previous attempt failed was committed, so it sends that batch's token
// again: Advance answers Replayed and no lesson row is written twice.
func (h *handlers) courseFlow(ctx context.Context, lease jobs.Lease) error {
	h.mu.Lock()
	attempt := len(h.course) + 1
	h.mu.Unlock()
	a := courseAttempt{generation: lease.Generation, startCursor: lease.Cursor}
	defer func() {
		h.mu.Lock()
		h.course = append(h.course, a)
		h.mu.Unlock()
	}()
	cursor := lease.Cursor
	if attempt > 1 && cursor > 0 {
		a.replayToken = lessonToken(cursor)
		res, err := h.publishLesson(ctx, lease, cursor, cursor-1)
		if err != nil {
			a.err = err
			return err
		}
		a.replay = &res
	}
	for cursor < lease.Total {
		if attempt == 1 && cursor == courseFailsAt {
			a.endCursor, a.err = cursor, errLessonService
			return errLessonService
		}
		res, err := h.publishLesson(ctx, lease, cursor+1, cursor)
		if err != nil {
			a.endCursor, a.err = cursor, err
			return err
		}
		a.tokens = append(a.tokens, lessonToken(cursor+1))
		cursor = res.Cursor
	}
	a.endCursor = cursor
	_, err := h.store.CompleteWith(ctx, h.pool, lease, func(tx pgx.Tx) error {
		return h.writeReport(ctx, tx, lease, fmt.Sprintf("course of %d lessons published", lease.Total))
	})
	a.err, a.completed = err, err == nil
	return err
}

// publishLesson records batch lesson (expected cursor expected, one item)
// with Advance as the first write of a transaction and, unless Advance
// answers Replayed, writes the lesson's row in the same transaction.
func (h *handlers) publishLesson(ctx context.Context, lease jobs.Lease, lesson, expected int64) (jobs.AdvanceResult, error) {
	var res jobs.AdvanceResult
	err := pgx.BeginFunc(ctx, h.pool, func(tx pgx.Tx) error {
		var err error
		if res, err = h.store.Advance(ctx, tx, lease, lessonToken(lesson), expected, 1); err != nil || res.Replayed {
			return err
		}
		_, err = tx.Exec(ctx, h.sql(`INSERT INTO {schema}.demo_lessons (job_id, lesson, generation) VALUES ($1, $2, $3)`),
			lease.JobID, lesson, lease.Generation)
		return err
	})
	return res, err
}

// sql names the demo's schema where text writes {schema}.
func (h *handlers) sql(text string) string { return qualify(text, h.store.Schema()) }

func lessonToken(lesson int64) string { return fmt.Sprintf("lesson-%d", lesson) }

// writeReport is a completion's product write.
func (h *handlers) writeReport(ctx context.Context, tx pgx.Tx, lease jobs.Lease, body string) error {
	_, err := tx.Exec(ctx, h.sql(`INSERT INTO {schema}.demo_reports (job_id, generation, body) VALUES ($1, $2, $3)`),
		lease.JobID, lease.Generation, body)
	return err
}

// outcomes records what each task's run returned to asynq, per task ID.
type outcomes struct {
	mu sync.Mutex
	m  map[string][]error
}

func newOutcomes() *outcomes { return &outcomes{m: map[string][]error{}} }

// middleware records the result of the rest of the chain.
func (o *outcomes) middleware(next asynq.Handler) asynq.Handler {
	return asynq.HandlerFunc(func(ctx context.Context, t *asynq.Task) error {
		err := next.ProcessTask(ctx, t)
		id, _ := asynq.GetTaskID(ctx)
		o.mu.Lock()
		o.m[id] = append(o.m[id], err)
		o.mu.Unlock()
		return err
	})
}

// of returns the results recorded for task id.
func (o *outcomes) of(id string) []error {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]error(nil), o.m[id]...)
}
