// Package redisop bounds each Redis call of jobreaper's Redis clients (the
// guard's marker reads, the enqueue helper, the daemon's listers, status
// readers and marker writes) with a timeout of its own, and words its
// errors: the operation first, and whether the call's own timeout fired.
package redisop

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Timeout derives a context that expires after d and returns it with a
// func that maps the call's error: nil stays nil; a call cut off by this
// timeout (not by the caller's context or an earlier caller deadline) reads
// "<op> timed out after <d>" and wraps context.DeadlineExceeded; anything
// else reads "<op>: <err>".
//
// The timeout is judged by the clock, not only by ctx.Err(): go-redis sets
// the socket deadline from ctx, and the socket's i/o timeout can be
// reported a moment before the context's own timer marks it done.
func Timeout(parent context.Context, op string, d time.Duration) (context.Context, func(error) error) {
	own := time.Now().Add(d)
	ctx, cancel := context.WithDeadline(parent, own)
	return ctx, func(err error) error {
		defer cancel()
		if err == nil {
			return nil
		}
		pdl, hasPDL := parent.Deadline()
		callerFirst := parent.Err() != nil || (hasPDL && !pdl.After(own))
		if !callerFirst && (errors.Is(ctx.Err(), context.DeadlineExceeded) || !time.Now().Before(own)) {
			if errors.Is(err, context.DeadlineExceeded) {
				return fmt.Errorf("%s timed out after %s: %w", op, d, err)
			}
			return fmt.Errorf("%s timed out after %s: %w: %w", op, d, context.DeadlineExceeded, err)
		}
		return fmt.Errorf("%s: %w", op, err)
	}
}

// KeyError maps a Redis error reply that is about the key itself (it holds
// a list, a hash, ...: WRONGTYPE) to an error wrapping wrongType and the
// reply, naming the key; any other error is returned wrapped with the key.
func KeyError(key string, err, wrongType error) error {
	var reply redis.Error
	if errors.As(err, &reply) && strings.HasPrefix(reply.Error(), "WRONGTYPE") {
		return fmt.Errorf("key %s is not a string (%w): %w", key, err, wrongType)
	}
	return fmt.Errorf("key %s: %w", key, err)
}
