package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jackc/pgx/v5"

	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/queue"
)

// Job kinds (the package doc says what each does).
const (
	kindComplete  = "complete"
	kindHang      = "hang"
	kindHeartbeat = "heartbeat"
	kindFail      = "fail"
	kindError     = "error"
	kindNil       = "nil"
	kindCompleted = "completed"
	kindLate      = "late"
)

var kinds = []string{kindComplete, kindHang, kindHeartbeat, kindFail, kindError, kindNil, kindCompleted, kindLate}

// lateGiveUp bounds how long the late kind waits for its reap's cancel
// before it completes anyway.
const lateGiveUp = time.Minute

// settings are the flags, and what a payload may override.
type settings struct {
	Kind           string
	HeartbeatEvery time.Duration
	RunFor         time.Duration
	HangAfter      time.Duration
	Code           string
	Wait           bool
	RetryKind      string
	IgnoreCancel   bool
}

// payload is a job's task payload; durations in Go syntax.
type payload struct {
	Kind           string `json:"kind"`
	HeartbeatEvery string `json:"heartbeat_every"`
	RunFor         string `json:"run_for"`
	HangAfter      string `json:"hang_after"`
	Code           string `json:"code"`
	Wait           bool   `json:"wait"`
	RetryKind      string `json:"retry_kind"`
	IgnoreCancel   bool   `json:"ignore_cancel"`
}

func kindOK(kind string) (string, error) {
	for _, k := range kinds {
		if kind == k {
			return kind, nil
		}
	}
	return "", fmt.Errorf("kind %q: want one of %s", kind, strings.Join(kinds, ", "))
}

type worker struct {
	store    *jobs.Store
	hb       *jobs.Heartbeater
	def      settings
	handlers *registry
	running  sync.WaitGroup
	// charges, when set, is the table (schema-qualified, quoted) a
	// completion inserts its charge row into, in CompleteWith's
	// transaction: (job_id, generation).
	charges string
}

// settingsOf returns the flags' settings overridden by the payload's.
func (w *worker) settingsOf(task *asynq.Task) (settings, error) {
	s := w.def
	if len(task.Payload()) == 0 {
		return s, nil
	}
	var p payload
	if err := json.Unmarshal(task.Payload(), &p); err != nil {
		return s, fmt.Errorf("payload %q: %w", task.Payload(), err)
	}
	var err error
	for _, k := range []struct {
		raw string
		to  *string
	}{{p.Kind, &s.Kind}, {p.RetryKind, &s.RetryKind}} {
		if k.raw == "" {
			continue
		}
		if *k.to, err = kindOK(k.raw); err != nil {
			return s, err
		}
	}
	for _, d := range []struct {
		raw string
		to  *time.Duration
	}{{p.HeartbeatEvery, &s.HeartbeatEvery}, {p.RunFor, &s.RunFor}, {p.HangAfter, &s.HangAfter}} {
		if d.raw == "" {
			continue
		}
		if *d.to, err = time.ParseDuration(d.raw); err != nil {
			return s, fmt.Errorf("payload duration %q: %w", d.raw, err)
		}
	}
	if p.Code != "" {
		s.Code = p.Code
	}
	s.Wait, s.IgnoreCancel = p.Wait, p.IgnoreCancel
	return s, nil
}

// handle runs behind the start guard: the lease is in ctx.
func (w *worker) handle(ctx context.Context, task *asynq.Task) error {
	w.running.Add(1)
	defer w.running.Done()
	lease, err := jobs.LeaseFromContext(ctx)
	if err != nil {
		return err
	}
	s, err := w.settingsOf(task)
	if err != nil {
		return fmt.Errorf("%w: %w", err, asynq.SkipRetry)
	}
	if retried, _ := asynq.GetRetryCount(ctx); retried > 0 {
		s.Wait = false
		if s.RetryKind != "" {
			s.Kind = s.RetryKind
		}
	}
	c := w.handlers.add(lease.JobID)
	defer w.handlers.remove(c)
	say("start %s generation %d kind %s", lease.JobID, lease.Generation, s.Kind)
	err = w.work(ctx, lease, s, c)
	say("returned %s generation %d: %v", lease.JobID, lease.Generation, err)
	return err
}

func (w *worker) work(ctx context.Context, lease jobs.Lease, s settings, c *control) error {
	switch s.Kind {
	case kindHang:
		<-ctx.Done()
		return ctx.Err()
	case kindHeartbeat, kindLate:
		if s.IgnoreCancel {
			ctx = context.WithoutCancel(ctx)
		}
		return w.heartbeat(ctx, lease, s, c)
	case kindCompleted:
		if err := w.complete(ctx, lease); err != nil {
			return err
		}
		return w.wait(ctx, lease, s, c)
	}
	if err := w.wait(ctx, lease, s, c); err != nil {
		return err
	}
	switch s.Kind {
	case kindFail:
		return queue.Failure(s.Code, errors.New("the fail kind's handler failed"))
	case kindError:
		return errors.New("the error kind's handler failed")
	case kindNil:
		return nil
	}
	return w.complete(ctx, lease)
}

// wait waits, when s says so, for a go command naming the job.
func (w *worker) wait(ctx context.Context, lease jobs.Lease, s settings, c *control) error {
	if !s.Wait {
		return nil
	}
	say("waiting %s generation %d", lease.JobID, lease.Generation)
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-c.goOn.c:
		return nil
	}
}

// heartbeat is the heartbeat kind.
func (w *worker) heartbeat(ctx context.Context, lease jobs.Lease, s settings, c *control) error {
	tick := time.NewTicker(s.HeartbeatEvery)
	defer tick.Stop()
	var end, hangAt <-chan time.Time
	if s.RunFor > 0 {
		end = time.After(s.RunFor)
	}
	if s.HangAfter > 0 {
		hangAt = time.After(s.HangAfter)
	}
	for mark := int64(1); ; mark++ {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-end:
			return w.complete(ctx, lease)
		case <-c.finish.c:
			return w.complete(ctx, lease)
		case <-hangAt:
			return w.hangThen(ctx, lease, s)
		case <-c.hang.c:
			return w.hangThen(ctx, lease, s)
		case <-tick.C:
			// Refused (reaped, reclaimed) ends the attempt; a failed
			// write (PostgreSQL away) is retried by the Heartbeater after
			// its backoff, at a later tick.
			if _, err := w.hb.Heartbeat(ctx, lease, mark); errors.Is(err, jobs.ErrStaleWorker) || errors.Is(err, jobs.ErrJobTerminal) {
				return err
			}
		}
	}
}

// hangThen hangs (hang); for the late kind, once the handler's context
// ended (the reap's cancel) or after lateGiveUp, it completes anyway with a
// context of its own: a late result, which the fence must refuse. It says
// "late <job id> generation <n>: <what CompleteWith returned>".
func (w *worker) hangThen(ctx context.Context, lease jobs.Lease, s settings) error {
	if s.Kind != kindLate {
		return w.hang(ctx, lease)
	}
	say("hung %s generation %d", lease.JobID, lease.Generation)
	select {
	case <-ctx.Done():
	case <-time.After(lateGiveUp):
	}
	lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	err := w.complete(lctx, lease)
	say("late %s generation %d: %v", lease.JobID, lease.Generation, err)
	return err
}

// hang stops heartbeating: the job really stalled.
func (w *worker) hang(ctx context.Context, lease jobs.Lease) error {
	say("hung %s generation %d", lease.JobID, lease.Generation)
	<-ctx.Done()
	return ctx.Err()
}

// complete completes the job through CompleteWith and says so when the
// completion was confirmed.
func (w *worker) complete(ctx context.Context, lease jobs.Lease) error {
	var fn func(pgx.Tx) error
	if w.charges != "" {
		fn = func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `INSERT INTO `+w.charges+` (job_id, generation) VALUES ($1, $2)`, lease.JobID, lease.Generation)
			return err
		}
	}
	if _, err := w.store.CompleteWith(ctx, nil, lease, fn); err != nil {
		return err
	}
	say("completed %s generation %d", lease.JobID, lease.Generation)
	return nil
}
