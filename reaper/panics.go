package reaper

import (
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
)

// PanickedPassesMax is how many daemon passes in a row may panic before
// the daemon gives up (Fatal). One panic may come from one bad value met
// once, and the next pass goes on without it; three in a row mean every
// pass meets it, so this process runs no useful pass while holding its
// leader lease: it hands the lease to another replica and exits, so that
// its supervisor restarts it and someone looks at the stack it logged.
const PanickedPassesMax = 3

// ErrPassPanicked is returned by RunOnce, wrapped with the panic's value,
// for a pass that panicked; the panic was recovered and logged with its
// stack, and Result.Panicked is true.
var ErrPassPanicked = errors.New("the pass panicked")

// ErrPassesPanicked is sent on Fatal when PanickedPassesMax daemon passes
// in a row panicked.
var ErrPassesPanicked = fmt.Errorf("%d passes in a row panicked", PanickedPassesMax)

// recovered is a panic recovered on some goroutine: its value and the
// stack of the goroutine it happened on, taken where it was recovered.
type recovered struct {
	value any
	stack []byte
}

// capture returns v, a value recover returned, with the current stack;
// a *recovered (a panic carried from another goroutine) is kept as it is,
// with the stack of the goroutine it happened on. Call it in the deferred
// function that recovered, so that the stack is the panicking one.
func capture(v any) *recovered {
	if r, ok := v.(*recovered); ok {
		return r
	}
	return &recovered{value: v, stack: debug.Stack()}
}

// attrs are the log attributes of the panic: its value and its stack.
func (r *recovered) attrs() []any {
	return []any{"panic", fmt.Sprint(r.value), "stack", string(r.stack)}
}

func (r *recovered) String() string { return fmt.Sprint(r.value) }

// contain runs fn and recovers a panic in it, returning it (nil when fn
// returned normally).
func contain(fn func()) (p *recovered) {
	defer func() {
		if v := recover(); v != nil {
			p = capture(v)
		}
	}()
	fn()
	return nil
}

// logPanic logs p once, at ERROR, with its value and stack.
func logPanic(log *slog.Logger, msg string, p *recovered, args ...any) {
	log.Error(msg, append(args, p.attrs()...)...)
}
