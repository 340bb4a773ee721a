package queue

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/jobreaper/jobreaper/internal/idcheck"
	"github.com/jobreaper/jobreaper/jobs"
)

// MarkerKeyPrefix starts the Redis key of every marker: the marker of job J
// is "jobreaper:reaped:J".
const MarkerKeyPrefix = "jobreaper:reaped:"

// MarkerTTL is how long a marker lives after its reap: 7 days (604800 s).
// A redelivery or lease-expiry retry of a reaped task arrives within
// minutes to days of the reap (asynq v0.26.0's recoverer retries a task
// about 1-2 min after its 30 s lease expired; a hard-timeout retry follows
// at most jobs.HardTimeoutDefault, 24 h, after the attempt started, plus
// asynq's retry backoff). After the
// marker expires the FAILED job row still makes the start guard refuse the
// task, so the marker need not outlive that window, and Redis does not
// accumulate one key per reaped job forever.
const MarkerTTL = 7 * 24 * time.Hour

// MarkerOpTimeoutDefault bounds each Redis call of a MarkerStore, so that a
// hung Redis turns into an error the caller handles (the guard fails
// closed, the reaper counts an error) instead of a stuck scan or worker.
const MarkerOpTimeoutDefault = 5 * time.Second

// ErrBadMarker means a marker key holds a value that is not a decimal
// generation, or is not a string at all (Redis answers WRONGTYPE). Nothing
// in jobreaper writes such a value; someone else wrote the key. It fails
// that one marker only: delete the key and the marker is written again.
var ErrBadMarker = errors.New("marker value is not a decimal generation")

// badMarkerReply maps a Redis error reply that is about the key itself (it
// holds a list, a hash, ...: WRONGTYPE) to ErrBadMarker, naming the key;
// any other error is returned as it is, wrapped with the key.
func badMarkerReply(key string, err error) error {
	var reply redis.Error
	if errors.As(err, &reply) && strings.HasPrefix(reply.Error(), "WRONGTYPE") {
		return fmt.Errorf("key %s is not a string (%w): %w", key, err, ErrBadMarker)
	}
	return fmt.Errorf("key %s: %w", key, err)
}

// ErrBadOption means an option of this package was given a value outside
// its rule; the error names the option, the value and the rule.
var ErrBadOption = errors.New("invalid option")

// setMarkerScript writes the marker only when the key is absent or holds an
// older generation, with its expiry in the same SET, so a marker never
// exists without a TTL and a retried write never extends the TTL.
//
// KEYS[1] marker key; ARGV[1] generation (decimal); ARGV[2] TTL in ms.
// Returns 1 when written, 0 when an equal or newer generation is already
// there, -1 when the key holds something that is not a generation.
//
// The stored value is read by the rule Get applies (parseGeneration):
// ASCII digits only, at most math.MaxInt64, compared as decimal strings.
// Lua's tonumber would read " 5", "5.0", "0x10", "1e3" and "nan" as
// numbers Get refuses, and compares as doubles, which cannot tell
// generations apart above 2^53.
var setMarkerScript = redis.NewScript(`
local function generation(s)
  if not string.find(s, "^%d+$") then
    return nil
  end
  s = string.gsub(s, "^0+", "")
  if s == "" then
    s = "0"
  end
  if #s > 19 or (#s == 19 and s > "9223372036854775807") then
    return nil
  end
  return s
end
local cur = redis.call("GET", KEYS[1])
if cur then
  local n = generation(cur)
  if n == nil then
    return -1
  end
  local g = generation(ARGV[1])
  if #n > #g or (#n == #g and n >= g) then
    return 0
  end
end
redis.call("SET", KEYS[1], ARGV[1], "PX", ARGV[2])
return 1
`)

// negativeGeneration is the error of a marker write whose generation is
// below 0: generations count claims from 0, so no marker can hold one.
func negativeGeneration(op, jobID string, generation int64) error {
	return fmt.Errorf("queue.MarkerStore.%s: job %s: generation %d is negative: %w", op, idcheck.QuoteID(jobID), generation, jobs.ErrInvalidArgument)
}

// parseGeneration reads a marker's value: a generation written in ASCII
// digits (no sign, space or other notation), at most math.MaxInt64; ok is
// false otherwise. setMarkerScript applies the same rule inside Redis.
func parseGeneration(v string) (gen int64, ok bool) {
	if v == "" || strings.TrimLeft(v, "0123456789") != "" {
		return 0, false
	}
	g, err := strconv.ParseInt(v, 10, 64)
	return g, err == nil
}

// MarkerStore reads and writes markers: the Redis key MarkerKeyPrefix+job
// ID, holding the generation that was reaped as a decimal string, expiring
// MarkerTTL after the reap. There is deliberately no delete: only expiry
// removes a marker, so no cleanup, completion or retry path can erase the
// record of a reap.
type MarkerStore struct {
	client    redis.UniversalClient
	opTimeout time.Duration
}

// MarkerOption configures a MarkerStore.
type MarkerOption func(*MarkerStore) error

// WithMarkerOpTimeout sets the timeout of each Redis call (default
// MarkerOpTimeoutDefault). d must be positive; NewMarkerStore returns an
// error wrapping ErrBadOption otherwise.
func WithMarkerOpTimeout(d time.Duration) MarkerOption {
	return func(s *MarkerStore) error {
		if d <= 0 {
			return fmt.Errorf("queue.WithMarkerOpTimeout(%s): %w: the timeout must be positive", d, ErrBadOption)
		}
		s.opTimeout = d
		return nil
	}
}

// NewMarkerStore returns a MarkerStore over client. It returns an error
// wrapping ErrBadOption when an option's value breaks its rule.
//
// Build client with ContextTimeoutEnabled: true. go-redis v9 ignores
// context deadlines otherwise, and a hung Redis then holds each call for
// the client's ReadTimeout or DialTimeout (default 5 s each) instead of
// the store's timeout (measured with go-redis v9.23.0).
func NewMarkerStore(client redis.UniversalClient, opts ...MarkerOption) (*MarkerStore, error) {
	s := &MarkerStore{client: client, opTimeout: MarkerOpTimeoutDefault}
	for _, o := range opts {
		if err := o(s); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// MarkerKey returns the Redis key of jobID's marker.
func MarkerKey(jobID string) string { return MarkerKeyPrefix + jobID }

// MarkerRemaining returns the TTL a marker written now must get so that it
// still expires MarkerTTL after the reap: MarkerTTL - (now - reapedAt),
// both times read from the database clock. It is <= 0 when the 7 days have
// passed, and Set then writes nothing.
func MarkerRemaining(reapedAt, now time.Time) time.Duration {
	return MarkerTTL - now.Sub(reapedAt)
}

// Set records that jobID was reaped at generation, with ttl as the
// marker's remaining lifetime (see MarkerRemaining; the caller computes it
// on the database clock, so a repair long after the reap never grants a
// fresh 7 days). One Lua step writes value and expiry together, and only
// when the key is absent or holds an older generation: a retried Set never
// extends the TTL, while a later reap of a requeued job at a higher
// generation gets its own lifetime.
//
// It returns set=true when it wrote the key; set=false, nil when ttl is
// below one millisecond (nothing is written) or the key already holds this
// or a newer generation. Errors: a call that exceeded the store's timeout
// ("queue.MarkerStore.Set timed out after 5s: ...", wrapping
// context.DeadlineExceeded); ErrBadMarker naming the key when the key holds
// a value that is not a generation by Get's rule (ASCII digits only, at
// most math.MaxInt64) or is not a string (it is left as is);
// jobs.ErrInvalidArgument for a negative generation (nothing sent); any
// other Redis error, wrapped.
func (s *MarkerStore) Set(ctx context.Context, jobID string, generation int64, ttl time.Duration) (set bool, err error) {
	ms := ttl.Milliseconds()
	if ms <= 0 {
		return false, nil
	}
	if generation < 0 {
		return false, negativeGeneration("Set", jobID, generation)
	}
	key := MarkerKey(jobID)
	ctx, done := s.op(ctx, "Set")
	n, err := setMarkerScript.Run(ctx, s.client, []string{key},
		strconv.FormatInt(generation, 10), ms).Int64()
	if err != nil {
		return false, done(badMarkerReply(key, err))
	}
	switch n {
	case 1:
		return true, done(nil)
	case 0:
		return false, done(nil)
	}
	return false, done(fmt.Errorf("key %s: %w", key, ErrBadMarker))
}

// Get returns the generation jobID's marker records. found is false (and
// err nil) when no marker exists: none was set, or it expired.
//
// Errors: a call that exceeded the store's timeout (wrapping
// context.DeadlineExceeded); ErrBadMarker naming the key when its value is
// not a generation (ASCII digits only, no sign, space or other notation, at
// most math.MaxInt64: what Set writes) or not a string; any other Redis
// error, wrapped. The start guard
// treats every error as "cannot tell" and does not run the task.
func (s *MarkerStore) Get(ctx context.Context, jobID string) (generation int64, found bool, err error) {
	key := MarkerKey(jobID)
	ctx, done := s.op(ctx, "Get")
	v, err := s.client.Get(ctx, key).Result()
	if errors.Is(err, redis.Nil) {
		return 0, false, done(nil)
	}
	if err != nil {
		return 0, false, done(badMarkerReply(key, err))
	}
	g, ok := parseGeneration(v)
	if !ok {
		return 0, false, done(fmt.Errorf("key %s holds %q: %w", key, v, ErrBadMarker))
	}
	return g, true, done(nil)
}

// op gives one Redis call its own timeout. Its done func names the
// operation in the error and, when the call's own timeout fired, says so
// and wraps context.DeadlineExceeded (go-redis may report the deadline as a
// network i/o timeout instead).
func (s *MarkerStore) op(ctx context.Context, name string) (context.Context, func(error) error) {
	return opTimeout(ctx, "queue.MarkerStore."+name, s.opTimeout)
}

// opTimeout derives a context that expires after d and returns it with a
// func that maps the call's error: nil stays nil; a call cut off by this
// timeout (not by the caller's context or an earlier caller deadline) reads
// "<op> timed out after <d>" and wraps context.DeadlineExceeded; anything
// else reads "<op>: <err>".
//
// The timeout is judged by the clock, not only by ctx.Err(): go-redis sets
// the socket deadline from ctx, and the socket's i/o timeout can be
// reported a moment before the context's own timer marks it done.
func opTimeout(parent context.Context, op string, d time.Duration) (context.Context, func(error) error) {
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
