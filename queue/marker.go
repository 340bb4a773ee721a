package queue

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/jobreaper/jobreaper/internal/redisop"
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

// ErrBadOption means an option of this package was given a value outside
// its rule; the error names the option, the value and the rule.
var ErrBadOption = errors.New("invalid option")

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
		return 0, false, done(redisop.KeyError(key, err, ErrBadMarker))
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
	return redisop.Timeout(ctx, "queue.MarkerStore."+name, s.opTimeout)
}
