package demo

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/hibiken/asynq"

	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/queue"
)

// Each claim acts where the story needs it, checks what it narrates
// against PostgreSQL and Redis, and returns its narrated line.

// claimHungReaped: the pass failed the hung job as stalled, with evidence
// that satisfies the rule, while asynq still showed its task as active.
func (w *world) claimHungReaped(ctx context.Context, obs *observations) (string, error) {
	id := w.ids.hung
	detail, found, err := w.event(ctx, id, "reaped", "{}")
	if err != nil {
		return "", err
	}
	if !found {
		return "", fmt.Errorf("job %s is FAILED but has no reaped event", id)
	}
	var ev evidence
	if err := json.Unmarshal(detail, &ev); err != nil {
		return "", fmt.Errorf("the reaped event of %s holds no evidence: %w", id, err)
	}
	row, err := w.readJob(ctx, id)
	if err != nil {
		return "", err
	}
	state, err := w.taskState(id)
	if err != nil {
		return "", err
	}
	switch {
	case row.status != jobs.StatusFailed || row.failureReason != jobs.ReasonStalled:
		return "", fmt.Errorf("job %s is %s (%s), want FAILED (stalled)", id, row.status, row.failureReason)
	case ev.Reason != jobs.ReasonStalled || ev.Generation != row.generation:
		return "", fmt.Errorf("the reaped event says reason %q generation %d, the row says stalled generation %d", ev.Reason, ev.Generation, row.generation)
	case !(ev.RuntimeSeconds > ev.MaxRuntimeSeconds) || !(ev.IdleSeconds >= ev.StallTimeoutSeconds):
		return "", fmt.Errorf("the evidence does not show a stall: runtime %.1fs vs max_runtime %.1fs, idle %.1fs vs stall timeout %.1fs",
			ev.RuntimeSeconds, ev.MaxRuntimeSeconds, ev.IdleSeconds, ev.StallTimeoutSeconds)
	case state != asynq.TaskStateActive:
		return "", fmt.Errorf("asynq shows task %s as %s, but its handler still hangs on w1: want active", id, state)
	}
	obs.reaped = &ev
	return fmt.Sprintf("hung job %s: started %s by %s (generation %d), silent since: no progress for %.1fs >= stall timeout %.1fs, "+
		"runtime %.1fs > max_runtime %.1fs, while asynq still shows its task active (asynq alone would leave it so as long as w1 lives) "+
		"-> reaped (FAILED, stalled)",
		id, ev.StartedAt.Format("15:04:05.000"), ev.Worker, ev.Generation, ev.IdleSeconds, ev.StallTimeoutSeconds,
		ev.RuntimeSeconds, ev.MaxRuntimeSeconds), nil
}

// claimMarker: the pass set the marker for the reaped generation, with
// its 7-day expiry.
func (w *world) claimMarker(ctx context.Context, obs *observations) (string, error) {
	id := w.ids.hung
	gen, found, err := w.markers.Get(ctx, id)
	if err != nil {
		return "", err
	}
	if !found || gen != obs.reaped.Generation {
		return "", fmt.Errorf("marker %s: found %v, generation %d; want generation %d", queue.MarkerKey(id), found, gen, obs.reaped.Generation)
	}
	rctx, cancel := context.WithTimeout(ctx, queue.MarkerOpTimeoutDefault)
	pttl, err := w.rdb.PTTL(rctx, queue.MarkerKey(id)).Result()
	cancel()
	if err != nil {
		return "", fmt.Errorf("reading the TTL of %s: %w", queue.MarkerKey(id), err)
	}
	// The pass set the marker a moment ago: its TTL is the full 7 days,
	// less at most a pass.
	if pttl <= 0 || pttl > queue.MarkerTTL || pttl < queue.MarkerTTL-time.Minute {
		return "", fmt.Errorf("marker %s has TTL %s, want just under %s", queue.MarkerKey(id), pttl, queue.MarkerTTL)
	}
	return fmt.Sprintf("marker %s holds generation %d and expires 7 days after the reap: TTL %ds of %ds (only expiry removes it)",
		queue.MarkerKey(id), gen, int64(math.Round(pttl.Seconds())), int64(queue.MarkerTTL.Seconds())), nil
}

// claimRedeliveryRefused: w1 stops as in a rolling deploy, asynq puts the
// hung task back, w2 receives it and its start guard refuses it.
func (w *world) claimRedeliveryRefused(ctx context.Context, _ *observations) (string, error) {
	id := w.ids.hung
	w.workers[0].shutdown()
	state, err := w.taskState(id)
	if err != nil {
		return "", err
	}
	if state != asynq.TaskStatePending {
		return "", fmt.Errorf("after w1 shut down, asynq shows task %s as %s, want pending (pushed back to its queue)", id, state)
	}
	w2, err := w.startWorker("w2")
	if err != nil {
		return "", err
	}
	if err := w.waitTaskState(ctx, id, asynq.TaskStateArchived); err != nil {
		return "", err
	}
	results := w2.outcomes.of(id)
	if len(results) != 1 {
		return "", fmt.Errorf("w2 saw task %s %d times, want once", id, len(results))
	}
	refusal := results[0]
	if !errors.Is(refusal, queue.ErrJobReaped) || !errors.Is(refusal, asynq.SkipRetry) {
		return "", fmt.Errorf("w2's start guard answered %s, want a refusal wrapping queue.ErrJobReaped and asynq.SkipRetry", errText(refusal))
	}
	if n := w.h.runsOn("w2", id); n != 0 {
		return "", fmt.Errorf("the handler of %s ran %d times on w2, want 0", id, n)
	}
	row, err := w.readJob(ctx, id)
	if err != nil {
		return "", err
	}
	if row.status != jobs.StatusFailed || row.generation != 1 {
		return "", fmt.Errorf("after the refusal job %s is %s at generation %d, want FAILED at generation 1 (no claim)", id, row.status, row.generation)
	}
	return fmt.Sprintf("worker w1 shut down (a rolling deploy) with the hung handler still running: asynq pushed %s back to its queue. "+
		"Worker w2 received it and its start guard refused it (job was reaped: FAILED, stalled), without a claim; "+
		"the handler ran 0 times on w2 and asynq archived the task instead of retrying it", id), nil
}

// claimLateCompletionRefused: the hung call returns and the handler tries
// to complete the job with a product row; the fence refuses it and nothing
// is written.
func (w *world) claimLateCompletionRefused(ctx context.Context, _ *observations) (string, error) {
	id := w.ids.hung
	w.h.releaseHung()
	var late lateResult
	select {
	case late = <-w.h.late:
	case <-time.After(waitTimeout):
		return "", fmt.Errorf("the hung handler did not finish its late completion within %s", waitTimeout)
	case <-ctx.Done():
		return "", ctx.Err()
	}
	if !errors.Is(late.err, jobs.ErrJobTerminal) {
		return "", fmt.Errorf("the late Complete returned %s, want jobs.ErrJobTerminal", errText(late.err))
	}
	reports, err := w.count(ctx, `SELECT count(*) FROM {schema}.demo_reports WHERE job_id = $1`, id)
	if err != nil {
		return "", err
	}
	row, err := w.readJob(ctx, id)
	if err != nil {
		return "", err
	}
	token := id + ":1"
	_, found, err := w.event(ctx, id, jobs.EventLateResultRejected,
		fmt.Sprintf(`{"operation": "Complete", "fencing_token": %q, "code": "job_terminal"}`, token))
	if err != nil {
		return "", err
	}
	gen, marked, err := w.markers.Get(ctx, id)
	if err != nil {
		return "", err
	}
	switch {
	case reports != 0:
		return "", fmt.Errorf("%d report rows of %s were written, want 0", reports, id)
	case row.status != jobs.StatusFailed || row.failureReason != jobs.ReasonStalled || row.generation != 1:
		return "", fmt.Errorf("job %s is %s (%s) at generation %d, want FAILED (stalled) at generation 1", id, row.status, row.failureReason, row.generation)
	case !found:
		return "", fmt.Errorf("no late_result_rejected event records the refused Complete of %s", token)
	case !marked || gen != 1:
		return "", fmt.Errorf("marker %s is gone or changed (found %v, generation %d)", queue.MarkerKey(id), marked, gen)
	}
	return fmt.Sprintf("the hung call of %s returned at %s and its handler called Complete with a report row in the same transaction "+
		"(unfenced, it would have turned the reaped job COMPLETED): refused (%s), 0 report rows written, the job still FAILED (stalled, generation 1), "+
		"a late_result_rejected event records attempt %s, the marker is still there", id, w.d.since(), jobs.ErrorCode(late.err), token), nil
}

// claimProgressingLeftAlone: the passes saw the progressing job past its
// limit but never idle for the stall timeout, and it completed.
func (w *world) claimProgressingLeftAlone(ctx context.Context, obs *observations) (string, error) {
	id := w.ids.progress
	w.h.mu.Lock()
	p := w.h.progress
	w.h.mu.Unlock()
	row, err := w.readJob(ctx, id)
	if err != nil {
		return "", err
	}
	reports, err := w.count(ctx, `SELECT count(*) FROM {schema}.demo_reports WHERE job_id = $1`, id)
	if err != nil {
		return "", err
	}
	reaps, err := w.count(ctx, `SELECT count(*) FROM {schema}.job_events WHERE job_id = $1 AND kind = 'reaped'`, id)
	if err != nil {
		return "", err
	}
	switch {
	case obs.progressPastLimit == 0:
		return "", fmt.Errorf("no pass saw %s past its max_runtime while it ran", id)
	case obs.progressMaxIdle >= demoStallTimeout:
		return "", fmt.Errorf("%s was idle %s at a pass, not under the stall timeout %s", id, secs(obs.progressMaxIdle), secs(demoStallTimeout))
	case reaps != 0:
		return "", fmt.Errorf("%s has %d reaped events, want 0", id, reaps)
	case !p.done || p.completeErr != nil:
		return "", fmt.Errorf("the handler of %s did not complete (done %v, Complete returned %s)", id, p.done, errText(p.completeErr))
	case p.written < 2 || row.progressMark < 2:
		return "", fmt.Errorf("%d heartbeats of %s were written (stored mark %d), want several", p.written, id, row.progressMark)
	case row.status != jobs.StatusCompleted || row.generation != 1 || reports != 1:
		return "", fmt.Errorf("job %s is %s at generation %d with %d report rows, want COMPLETED at generation 1 with 1", id, row.status, row.generation, reports)
	}
	return fmt.Sprintf("progressing job %s: %d heartbeats with an advancing progress mark, %d written through the %s limiter (stored mark %d); "+
		"%d passes saw its runtime past max_runtime %s (up to %s) with its idle time at most %s < stall timeout %s -> left alone; "+
		"it finished through Complete after %s -> COMPLETED (generation 1), 1 report row",
		id, p.calls, p.written, secs(demoHeartbeatInterval), row.progressMark,
		obs.progressPastLimit, secs(demoMaxRuntime), secs(obs.progressMaxRuntime), secs(obs.progressMaxIdle), secs(demoStallTimeout),
		secs(row.runtime)), nil
}

// claimFinished: the job that finishes at once is completed, untouched.
func (w *world) claimFinished(ctx context.Context, _ *observations) (string, error) {
	id := w.ids.finish
	row, err := w.readJob(ctx, id)
	if err != nil {
		return "", err
	}
	reports, err := w.count(ctx, `SELECT count(*) FROM {schema}.demo_reports WHERE job_id = $1`, id)
	if err != nil {
		return "", err
	}
	if row.status != jobs.StatusCompleted || row.generation != 1 || reports != 1 || row.runtime > demoMaxRuntime {
		return "", fmt.Errorf("job %s is %s at generation %d after %s with %d report rows, want COMPLETED at generation 1 within %s with 1",
			id, row.status, row.generation, secs(row.runtime), reports, secs(demoMaxRuntime))
	}
	return fmt.Sprintf("finishing job %s: completed through Complete %dms after its start, within max_runtime %s -> COMPLETED (generation 1), 1 report row",
		id, row.runtime.Milliseconds(), secs(demoMaxRuntime)), nil
}

// claimCourseResumed: attempt 1 advanced to 2 of 4 and failed; attempt 2
// claimed a new generation, resumed at 2, got its re-sent batch Replayed,
// finished and completed, with one lesson row per lesson.
func (w *world) claimCourseResumed(ctx context.Context, _ *observations) (string, error) {
	id := w.ids.course
	w.h.mu.Lock()
	attempts := slices.Clone(w.h.course)
	w.h.mu.Unlock()
	if len(attempts) != 2 {
		return "", fmt.Errorf("the course flow ran %d attempts, want 2", len(attempts))
	}
	a1, a2 := attempts[0], attempts[1]
	switch {
	case a1.generation != 1 || a1.startCursor != 0 || a1.endCursor != courseFailsAt || !errors.Is(a1.err, errLessonService):
		return "", fmt.Errorf("attempt 1 ran generation %d from cursor %d to %d and returned %s; want generation 1 from 0 to %d failing",
			a1.generation, a1.startCursor, a1.endCursor, errText(a1.err), courseFailsAt)
	case a2.generation != 2 || a2.startCursor != courseFailsAt:
		return "", fmt.Errorf("attempt 2 ran generation %d from cursor %d; want generation 2 from %d", a2.generation, a2.startCursor, courseFailsAt)
	case a2.replay == nil || !a2.replay.Replayed || a2.replay.Cursor != courseFailsAt || a2.replay.Generation != 1:
		return "", fmt.Errorf("attempt 2's re-sent batch %s was not answered Replayed at cursor %d by generation 1 (%+v)", a2.replayToken, courseFailsAt, a2.replay)
	case !a2.completed || a2.endCursor != courseLessons:
		return "", fmt.Errorf("attempt 2 ended at cursor %d, completed %v (%s); want %d and completed", a2.endCursor, a2.completed, errText(a2.err), courseLessons)
	}
	row, err := w.readJob(ctx, id)
	if err != nil {
		return "", err
	}
	lessons, err := w.count(ctx, `SELECT count(*) FROM {schema}.demo_lessons WHERE job_id = $1`, id)
	if err != nil {
		return "", err
	}
	distinct, err := w.count(ctx, `SELECT count(DISTINCT lesson) FROM {schema}.demo_lessons WHERE job_id = $1`, id)
	if err != nil {
		return "", err
	}
	batches, err := w.count(ctx, `SELECT count(*) FROM {schema}.job_batches
 WHERE job_id = $1 AND generation = CASE WHEN cursor_after <= $2 THEN 1 ELSE 2 END`, id, courseFailsAt)
	if err != nil {
		return "", err
	}
	switch {
	case row.status != jobs.StatusCompleted || row.generation != 2 || row.cursor != courseLessons || row.total != courseLessons:
		return "", fmt.Errorf("job %s is %s at generation %d, cursor %d of %d; want COMPLETED at generation 2, cursor %d of %d",
			id, row.status, row.generation, row.cursor, row.total, courseLessons, courseLessons)
	case lessons != courseLessons || distinct != courseLessons:
		return "", fmt.Errorf("%d lesson rows for %d lessons, want %d, one per lesson", lessons, distinct, courseLessons)
	case batches != courseLessons:
		return "", fmt.Errorf("%d of the %d batch records name the generation that published them", batches, courseLessons)
	}
	return fmt.Sprintf("course job %s: attempt 1 (generation 1) advanced cursor 0 -> %d of %d with batch tokens %s, then failed (%v); "+
		"asynq retried the task and attempt 2 claimed generation 2 and resumed from its cursor at %d: it re-sent %s -> Replayed "+
		"(recorded by generation 1, no row written again), then %s -> cursor %d of %d, and completed -> COMPLETED, %d lesson rows, one per lesson",
		id, courseFailsAt, courseLessons, strings.Join(a1.tokens, ", "), a1.err, a2.startCursor, a2.replayToken,
		strings.Join(a2.tokens, ", "), a2.endCursor, courseLessons, lessons), nil
}

// errText renders err, nil included, for a message that says what a call
// returned instead of what it should have.
func errText(err error) string {
	if err == nil {
		return "nil"
	}
	return err.Error()
}
