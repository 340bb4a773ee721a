package reaper

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"
)

// ErrAlreadyStarted is returned by Start when the loop is running.
var ErrAlreadyStarted = errors.New("reaper already started")

// Start runs the daemon loop in the background and returns at once: after a
// random delay of up to StartJitter it runs a pass, then one every Interval,
// until ctx is done or Stop is called. A pass that fails is logged and the
// loop goes on: one failed pass never stops the daemon. A pass that panics
// (on any goroutine it starts) is recovered, logged with its stack and
// counted, and the loop goes on; after PanickedPassesMax in a row the loop
// releases its leader lease and ends, and Fatal says so. It returns
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
	// Sent after everything below has stopped (the deferred calls run in
	// reverse): by the time cmd reads Fatal, the leader lease is released.
	var fatal error
	defer func() {
		if fatal != nil {
			r.opts.Metrics.notLeading()
			select {
			case r.fatal <- fatal:
			default: // an earlier loop's fatal condition is still unread
			}
		}
	}()
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
		// time. Whatever ends the loop (ctx done, too many panicked
		// passes, a panic of the loop itself), the renewals are stopped
		// and waited for, then the leader lease is released: this
		// goroutine never waits on one that only ends with the process.
		lctx, stopRenewals := context.WithCancel(ctx)
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			l.run(lctx, r.stopPass)
		}()
		defer func() {
			stopRenewals()
			wg.Wait()
			l.release(context.WithoutCancel(ctx))
		}()
	}
	panicked := 0
	for {
		if r.daemonPass(ctx) {
			panicked++
		} else {
			panicked = 0
		}
		if panicked >= PanickedPassesMax {
			fatal = ErrPassesPanicked
			r.log.Error(fmt.Sprintf("%d passes in a row panicked: this daemon stops running passes, gives its leader lease up "+
				"to another replica and stops, so that it is restarted; see the stacks logged above", panicked))
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-ticker.Chan():
		}
	}
}

// Fatal receives ErrPassesPanicked when PanickedPassesMax daemon passes in
// a row panicked. The loop has then ended: it runs no more passes, its
// leader lease renewals have stopped and the lease is released (this
// replica's jobreaper_leader is 0). The daemon's main waits on it beside
// its signals and exits, so that its supervisor restarts it; Stop still
// returns at once. The channel is the same for the Reaper's life.
func (r *Reaper) Fatal() <-chan error { return r.fatal }

// daemonPass runs one pass of the loop and reports whether it panicked.
// With a leader lease it first takes or renews it (one statement) and runs
// the pass only when this replica holds it: a replica resumed after a
// pause (SIGSTOP) starts no pass until it holds the leader lease again.
// The pass runs under a context that stopPass cancels when the leader
// lease is lost. An attempt that panics counts as a panicked pass.
func (r *Reaper) daemonPass(ctx context.Context) (panicked bool) {
	if l := r.opts.LeaderLease; l != nil {
		held, p := l.attempt(ctx)
		if p != nil {
			r.opts.Metrics.CountPanic()
			return true
		}
		if !held {
			// A follower makes no uncovered-queue check: what it
			// reported as a leader is no longer its to report.
			r.forgetUncovered()
			return false
		}
	}
	pctx, cancel := context.WithCancel(ctx)
	r.mu.Lock()
	r.passCancel = cancel
	r.mu.Unlock()
	defer func() {
		r.mu.Lock()
		r.passCancel = nil
		r.mu.Unlock()
		cancel()
	}()
	// RunOnce logs its own errors and panics; the loop only carries on.
	res, _ := r.RunOnce(pctx)
	return res.Panicked
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
