package reaper

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"time"
)

// ErrAlreadyStarted is returned by Start when the loop is running.
var ErrAlreadyStarted = errors.New("reaper already started")

// Start runs the daemon loop in the background and returns at once: after a
// random delay of up to StartJitter it runs a pass, then one every Interval,
// until ctx is done or Stop is called. A pass that fails is logged and the
// loop goes on: one failed pass never stops the daemon. It returns
// ErrAlreadyStarted when called twice without Stop.
func (r *Reaper) Start(ctx context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cancel != nil {
		return ErrAlreadyStarted
	}
	ctx, cancel := context.WithCancel(ctx)
	r.cancel = cancel
	r.stopped = make(chan struct{})
	go r.loop(ctx, r.stopped)
	return nil
}

// Stop ends the loop and waits for a running pass to return. It is
// idempotent and safe without a prior Start.
func (r *Reaper) Stop() {
	r.mu.Lock()
	cancel, stopped := r.cancel, r.stopped
	r.cancel, r.stopped = nil, nil
	r.mu.Unlock()
	if cancel == nil {
		return
	}
	cancel()
	<-stopped
}

func (r *Reaper) loop(ctx context.Context, stopped chan struct{}) {
	defer close(stopped)
	clock := r.opts.Clock
	if j := r.opts.StartJitter; j > 0 {
		select {
		case <-ctx.Done():
			return
		case <-clock.After(time.Duration(rand.Int64N(int64(j)))):
		}
	}
	ticker := clock.NewTicker(r.opts.Interval)
	defer ticker.Stop()
	if l := r.opts.LeaderLease; l != nil {
		// Renewals and takeovers run on their own cadence (Interval/3), so
		// a long pass keeps its leader lease and a follower takes over in
		// time; a clean exit releases it.
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			l.run(ctx, r.stopPass)
		}()
		defer func() {
			wg.Wait()
			l.release(context.WithoutCancel(ctx))
		}()
	}
	for {
		r.daemonPass(ctx)
		select {
		case <-ctx.Done():
			return
		case <-ticker.Chan():
		}
	}
}

// daemonPass runs one pass of the loop. With a leader lease it first
// takes or renews it (one statement) and runs the pass only when this
// replica holds it: a replica resumed after a pause (SIGSTOP) starts no
// pass until it holds the leader lease again. The pass runs under a
// context that stopPass cancels when the leader lease is lost.
func (r *Reaper) daemonPass(ctx context.Context) {
	if l := r.opts.LeaderLease; l != nil && !l.Attempt(ctx) {
		return
	}
	pctx, cancel := context.WithCancel(ctx)
	r.mu.Lock()
	r.passCancel = cancel
	r.mu.Unlock()
	// RunOnce logs its own errors; the loop only carries on.
	_, _ = r.RunOnce(pctx)
	r.mu.Lock()
	r.passCancel = nil
	r.mu.Unlock()
	cancel()
}

// stopPass cancels the running daemon pass, if any: its leader lease was
// lost. Reaps in flight roll back at their leader lease check.
func (r *Reaper) stopPass() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.passCancel != nil {
		r.log.Warn("leader lease lost during a pass; the pass stops")
		r.passCancel()
	}
}
