package demo

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/hibiken/asynq"

	"github.com/jobreaper/jobreaper/reaper"
)

// passesTimeout bounds the first act: the hung job is reaped about 4s in,
// the progressing job finishes after about 6s.
const passesTimeout = 40 * time.Second

// waitTimeout bounds each later wait: a task to be archived, the hung
// call's late result.
const waitTimeout = 15 * time.Second

// observations are what the story saw during the reaper passes.
type observations struct {
	passes int
	// reaped is the evidence of the hung job's reap, read after the pass
	// that reaped it.
	reaped *evidence
	// progressPastLimit counts the passes after which the progressing job
	// was PROCESSING with its runtime past max_runtime; progressMaxIdle and
	// progressMaxRuntime are its largest idle time and runtime then.
	progressPastLimit                   int
	progressMaxIdle, progressMaxRuntime time.Duration
}

// story tells the story and returns the number of claims it checked, or
// the first claim that did not hold.
func (w *world) story(ctx context.Context) (int, error) {
	say := w.d.say
	if _, err := w.startWorker("w1"); err != nil {
		return 0, err
	}
	if err := w.enqueue(ctx); err != nil {
		return 0, fmt.Errorf("enqueueing the story's jobs: %w", err)
	}
	say("Worker w1 (asynq, the start guard in front of its handlers) runs four jobs, each type with max_runtime %s:", secs(demoMaxRuntime))
	say("  %s  hangs silently on a call that never returns", w.ids.hung)
	say("  %s  works for %s, past its limit, reporting progress through heartbeats", w.ids.progress, secs(progressStep*progressSteps))
	say("  %s  finishes at once", w.ids.finish)
	say("  %s  course flow: publishes %d lessons, one batch each; its first attempt fails after lesson %d",
		w.ids.course, courseLessons, courseFailsAt)
	say("Reaper passes every %s (reaper.RunOnce, as the daemon runs them):", secs(demoInterval))

	claims := 0
	obs, err := w.passes(ctx, &claims)
	if err != nil {
		return claims, err
	}
	steps := []struct {
		name  string
		check func(context.Context, *observations) (string, error)
	}{
		{"redelivery refused", w.claimRedeliveryRefused},
		{"late completion refused", w.claimLateCompletionRefused},
		{"progressing job left alone", w.claimProgressingLeftAlone},
		{"finishing job completed", w.claimFinished},
		{"course flow resumed", w.claimCourseResumed},
	}
	for _, s := range steps {
		line, err := s.check(ctx, obs)
		if err != nil {
			return claims, fmt.Errorf("claim %d (%s): %w", claims+1, s.name, err)
		}
		claims++
		say("%d. %s", claims, line)
	}
	return claims, nil
}

// passes runs reaper passes every interval until the hung job is reaped
// and the other three jobs are completed, narrating each pass and, right
// after the pass that reaped it, the hung job's reap and marker.
func (w *world) passes(ctx context.Context, claims *int) (*observations, error) {
	obs := &observations{}
	deadline := time.Now().Add(passesTimeout)
	tick := time.NewTicker(w.cfg.Interval)
	defer tick.Stop()
	for {
		res, err := w.reaper.RunOnce(ctx)
		if ctx.Err() != nil {
			return nil, fmt.Errorf("interrupted during the reaper passes: %w", ctx.Err())
		}
		if err != nil {
			return nil, fmt.Errorf("reaper pass %d could not run: %w", obs.passes+1, err)
		}
		obs.passes++
		w.d.say("pass %d (%s): %s", obs.passes, w.d.since(), describePass(res))
		if res.Errors > 0 {
			return nil, fmt.Errorf("reaper pass %d had %d errors (logged on stderr)", obs.passes, res.Errors)
		}
		rows, err := w.readJobs(ctx)
		if err != nil {
			return nil, err
		}
		if p := rows[w.ids.progress]; p.status == "PROCESSING" && p.runtime > demoMaxRuntime {
			obs.progressPastLimit++
			obs.progressMaxIdle = max(obs.progressMaxIdle, p.idle)
			obs.progressMaxRuntime = max(obs.progressMaxRuntime, p.runtime)
		}
		if obs.reaped == nil && rows[w.ids.hung].status == "FAILED" {
			if err := w.narrateReap(ctx, obs, claims); err != nil {
				return nil, err
			}
		}
		var waiting []string
		if obs.reaped == nil {
			waiting = append(waiting, w.ids.hung+" to be reaped")
		}
		for _, id := range []string{w.ids.progress, w.ids.finish, w.ids.course} {
			if rows[id].status != "COMPLETED" {
				waiting = append(waiting, fmt.Sprintf("%s to complete (it is %s)", id, rows[id].status))
			}
		}
		if len(waiting) == 0 {
			return obs, nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("after %d passes in %s still waiting for %s", obs.passes, passesTimeout, strings.Join(waiting, ", "))
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("interrupted during the reaper passes: %w", ctx.Err())
		case <-tick.C:
		}
	}
}

// narrateReap checks and narrates claims 1 and 2 right after the pass that
// reaped the hung job, while its marker is fresh.
func (w *world) narrateReap(ctx context.Context, obs *observations, claims *int) error {
	for _, s := range []struct {
		name  string
		check func(context.Context, *observations) (string, error)
	}{
		{"hung job reaped with its evidence", w.claimHungReaped},
		{"marker and TTL", w.claimMarker},
	} {
		line, err := s.check(ctx, obs)
		if err != nil {
			return fmt.Errorf("claim %d (%s): %w", *claims+1, s.name, err)
		}
		*claims++
		w.d.say("%d. %s", *claims, line)
	}
	return nil
}

// describePass renders a pass's Result on one line.
func describePass(res reaper.Result) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d active %s scanned, reaped %d", res.Scanned, plural(res.Scanned, "task", "tasks"), res.Reaped)
	if n := sum(res.Skipped); n > 0 {
		parts := make([]string, 0, len(res.Skipped))
		for _, k := range slices.Sorted(maps.Keys(res.Skipped)) {
			parts = append(parts, fmt.Sprintf("%s %d", k, res.Skipped[k]))
		}
		fmt.Fprintf(&b, ", left alone %d (%s)", n, strings.Join(parts, ", "))
	}
	return b.String()
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

func sum(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

// taskState returns the asynq state of the task of job id.
func (w *world) taskState(id string) (asynq.TaskState, error) {
	info, err := w.insp.GetTaskInfo(w.queue, id)
	if err != nil {
		return 0, fmt.Errorf("looking up task %s in asynq: %w", id, err)
	}
	return info.State, nil
}

// waitTaskState polls until the task of job id is in state want.
func (w *world) waitTaskState(ctx context.Context, id string, want asynq.TaskState) error {
	deadline := time.Now().Add(waitTimeout)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		got, err := w.taskState(id)
		if err != nil && !errors.Is(err, asynq.ErrTaskNotFound) {
			return err
		}
		if err == nil && got == want {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("task %s did not become %s within %s (it is %s)", id, want, waitTimeout, got)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
}
