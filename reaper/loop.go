package reaper

import (
	"context"
	"errors"
	"math/rand/v2"
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
	for {
		// RunOnce logs its own errors; the loop only carries on.
		_, _ = r.RunOnce(ctx)
		select {
		case <-ctx.Done():
			return
		case <-ticker.Chan():
		}
	}
}
