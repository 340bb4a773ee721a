package asynqstate

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/jobreaper/jobreaper/internal/redisop"
	"github.com/jobreaper/jobreaper/queue"
)

// EvictionPolicySafe is the only maxmemory-policy under which Redis never
// evicts a marker: every other policy may evict keys that have a TTL
// (volatile-*) or any key (allkeys-*) when memory runs out, and markers
// always have one.
const EvictionPolicySafe = "noeviction"

// ErrConfigRefused means Redis refused CONFIG GET: managed services (and
// ACLs without +config) often disable or rename the command, so the
// eviction policy cannot be checked from here.
var ErrConfigRefused = errors.New("Redis refused CONFIG GET")

// PolicyReader reads Redis's eviction policy. It is a type of its own, not
// a method of the marker writer, so that the marker types keep only their
// reads and writes.
type PolicyReader struct {
	client    redis.UniversalClient
	opTimeout time.Duration
}

// NewPolicyReader returns a PolicyReader over client (the Redis that holds
// the markers; build it with ContextTimeoutEnabled: true) whose calls are
// bounded by opTimeout (queue.MarkerOpTimeoutDefault when not positive).
func NewPolicyReader(client redis.UniversalClient, opTimeout time.Duration) *PolicyReader {
	if opTimeout <= 0 {
		opTimeout = queue.MarkerOpTimeoutDefault
	}
	return &PolicyReader{client: client, opTimeout: opTimeout}
}

// EvictionPolicy reads the maxmemory-policy of the Redis, with CONFIG GET,
// bounded by the reader's timeout.
//
// Errors: ErrConfigRefused, wrapped with Redis's reply, when Redis answers
// the command with an error (unknown command, NOPERM, ...) or with no
// value; a call that exceeded the store's timeout (wrapping
// context.DeadlineExceeded); any other failure, wrapped.
func (s *PolicyReader) EvictionPolicy(ctx context.Context) (string, error) {
	ctx, done := redisop.Timeout(ctx, "asynqstate.PolicyReader.EvictionPolicy", s.opTimeout)
	vals, err := s.client.ConfigGet(ctx, "maxmemory-policy").Result()
	var reply redis.Error
	if errors.As(err, &reply) {
		return "", done(fmt.Errorf("%w: %w", ErrConfigRefused, err))
	}
	if err != nil {
		return "", done(err)
	}
	policy, ok := vals["maxmemory-policy"]
	if !ok || policy == "" {
		return "", done(fmt.Errorf("%w: no maxmemory-policy in its answer", ErrConfigRefused))
	}
	return policy, done(nil)
}
