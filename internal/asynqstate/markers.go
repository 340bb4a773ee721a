package asynqstate

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/jobreaper/jobreaper/internal/idcheck"
	"github.com/jobreaper/jobreaper/internal/redisop"
	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/queue"
)

// setMarkerScript writes the marker only when the key is absent or holds an
// older generation, with its expiry in the same SET, so a marker never
// exists without a TTL and a retried write never extends the TTL.
//
// KEYS[1] marker key; ARGV[1] generation (decimal); ARGV[2] TTL in ms.
// Returns 1 when written, 0 when an equal or newer generation is already
// there, -1 when the key holds something that is not a generation.
//
// The stored value is read by the rule the guard's queue.MarkerStore.Get
// applies:
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

// MarkerWriter writes markers, the daemon's record of a reap in Redis (see
// queue.MarkerStore, the guard's reader of the same keys): the key
// queue.MarkerKey of the job, holding the generation reaped as a decimal
// string, expiring queue.MarkerTTL after the reap. Every write is the
// compare-and-set of setMarkerScript. There is deliberately no delete: only
// expiry removes a marker, so no cleanup, completion or retry path can
// erase the record of a reap. It is safe for concurrent use.
type MarkerWriter struct {
	client    redis.UniversalClient
	opTimeout time.Duration
}

// NewMarkerWriter returns a MarkerWriter over client (build it with
// ContextTimeoutEnabled: true, see queue.NewMarkerStore), each call bounded
// by opTimeout (queue.MarkerOpTimeoutDefault when not positive).
func NewMarkerWriter(client redis.UniversalClient, opTimeout time.Duration) *MarkerWriter {
	if opTimeout <= 0 {
		opTimeout = queue.MarkerOpTimeoutDefault
	}
	return &MarkerWriter{client: client, opTimeout: opTimeout}
}

// op gives one Redis call its own timeout; its done func names the
// operation ("asynqstate.MarkerWriter.<name>") in the error.
func (s *MarkerWriter) op(ctx context.Context, name string) (context.Context, func(error) error) {
	return redisop.Timeout(ctx, "asynqstate.MarkerWriter."+name, s.opTimeout)
}

// negativeGeneration is the error of a marker write whose generation is
// below 0: generations count claims from 0, so no marker can hold one.
func negativeGeneration(op, jobID string, generation int64) error {
	return fmt.Errorf("asynqstate.MarkerWriter.%s: job %s: generation %d is negative: %w", op, idcheck.QuoteID(jobID), generation, jobs.ErrInvalidArgument)
}

// MarkerRemaining returns the TTL a marker written now must get so that it
// still expires queue.MarkerTTL after the reap: queue.MarkerTTL - (now -
// reapedAt),
// both times read from the database clock. It is <= 0 when the 7 days have
// passed, and Set then writes nothing.
func MarkerRemaining(reapedAt, now time.Time) time.Duration {
	return queue.MarkerTTL - now.Sub(reapedAt)
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
// ("asynqstate.MarkerWriter.Set timed out after 5s: ...", wrapping
// context.DeadlineExceeded); queue.ErrBadMarker naming the key when the key holds
// a value that is not a generation by the guard's rule (ASCII digits only, at
// most math.MaxInt64) or is not a string (it is left as is);
// jobs.ErrInvalidArgument for a negative generation (nothing sent); any
// other Redis error, wrapped.
func (s *MarkerWriter) Set(ctx context.Context, jobID string, generation int64, ttl time.Duration) (set bool, err error) {
	ms := ttl.Milliseconds()
	if ms <= 0 {
		return false, nil
	}
	if generation < 0 {
		return false, negativeGeneration("Set", jobID, generation)
	}
	key := queue.MarkerKey(jobID)
	ctx, done := s.op(ctx, "Set")
	n, err := setMarkerScript.Run(ctx, s.client, []string{key},
		strconv.FormatInt(generation, 10), ms).Int64()
	if err != nil {
		return false, done(redisop.KeyError(key, err, queue.ErrBadMarker))
	}
	switch n {
	case 1:
		return true, done(nil)
	case 0:
		return false, done(nil)
	}
	return false, done(fmt.Errorf("key %s: %w", key, queue.ErrBadMarker))
}

// MarkerWrite is one marker for SetMany: the job, the generation reaped,
// and the marker's remaining lifetime (see Set).
type MarkerWrite struct {
	JobID      string
	Generation int64
	TTL        time.Duration
}

// MarkerResult is SetMany's answer for one write, as Set would give it.
type MarkerResult struct {
	Set bool
	Err error
}

// SetMany writes many markers with Set's compare-and-set (only when the key
// is absent or holds an older generation; value and expiry in one step), all
// in one pipeline, bounded by one call of the store's timeout. Each write
// gets its own result: one key holding garbage (queue.ErrBadMarker) fails only
// that write. When the pipeline itself fails (Redis unreachable, the
// timeout), every write carries that error. A write whose TTL is below one
// millisecond is not sent and answers Set=false.
func (s *MarkerWriter) SetMany(ctx context.Context, writes []MarkerWrite) []MarkerResult {
	out := make([]MarkerResult, len(writes))
	ctx, done := s.op(ctx, "SetMany")
	cmds := make([]*redis.Cmd, len(writes))
	run := func(useEval bool, which []int) error {
		_, err := s.client.Pipelined(ctx, func(p redis.Pipeliner) error {
			for _, i := range which {
				w := writes[i]
				keys, gen, ms := []string{queue.MarkerKey(w.JobID)}, strconv.FormatInt(w.Generation, 10), w.TTL.Milliseconds()
				if useEval {
					cmds[i] = setMarkerScript.Eval(ctx, p, keys, gen, ms)
				} else {
					cmds[i] = setMarkerScript.EvalSha(ctx, p, keys, gen, ms)
				}
			}
			return nil
		})
		return err
	}
	var todo []int
	for i, w := range writes {
		switch {
		case w.TTL.Milliseconds() <= 0:
		case w.Generation < 0:
			out[i].Err = negativeGeneration("SetMany", w.JobID, w.Generation)
		default:
			todo = append(todo, i)
		}
	}
	if len(todo) == 0 {
		_ = done(nil)
		return out
	}
	// EVALSHA first; a Redis that has not cached the script yet (restart,
	// SCRIPT FLUSH) answers NOSCRIPT, and those writes are sent again with
	// the script's text.
	err := run(false, todo)
	if err != nil {
		var again []int
		for _, i := range todo {
			if e := cmds[i].Err(); e != nil && strings.HasPrefix(e.Error(), "NOSCRIPT") {
				again = append(again, i)
			}
		}
		if len(again) > 0 {
			err = run(true, again)
		}
	}
	if err != nil && isConnError(err) {
		err = done(err)
		for _, i := range todo {
			out[i].Err = err
		}
		return out
	}
	_ = done(nil)
	for _, i := range todo {
		n, err := cmds[i].Int64()
		key := queue.MarkerKey(writes[i].JobID)
		switch {
		case err != nil:
			out[i].Err = fmt.Errorf("asynqstate.MarkerWriter.SetMany: key %s: %w", key, err)
		case n == 1:
			out[i].Set = true
		case n == -1:
			out[i].Err = fmt.Errorf("asynqstate.MarkerWriter.SetMany: key %s: %w", key, queue.ErrBadMarker)
		}
	}
	return out
}

// isConnError tells a failure of the pipeline as a whole (the connection or
// the call's deadline) from an error reply of single commands, which
// go-redis also returns as the pipeline's error.
func isConnError(err error) bool {
	_, isReply := err.(redis.Error)
	return !isReply
}

// ReassertMany answers as SetMany would for writes, but first reads every
// key in one pipeline of GETs (MissingMany) and runs the compare-and-set
// only for the keys that do not already hold this generation or a newer
// one (missing, older, or holding something jobreaper never writes, which
// the compare-and-set then reports as queue.ErrBadMarker). Re-asserting markers
// that are almost always there so costs a GET each instead of a script
// each. A marker that changes between the read and the write is still
// judged by the compare-and-set. When the read pipeline fails as a whole
// (Redis unreachable, the timeout), every write carries that error.
func (s *MarkerWriter) ReassertMany(ctx context.Context, writes []MarkerWrite) []MarkerResult {
	out := s.MissingMany(ctx, writes)
	var rest []MarkerWrite
	var restAt []int
	for i, r := range out {
		if r.Set && r.Err == nil {
			rest = append(rest, writes[i])
			restAt = append(restAt, i)
		}
		out[i].Set = false
	}
	for k, r := range s.SetMany(ctx, rest) {
		out[restAt[k]] = r
	}
	return out
}

// MissingMany reads every key of writes in one pipeline of GETs and
// writes nothing. Its answer for each write has Set true when SetMany
// would have to run the compare-and-set for it: the key is missing, holds
// an older generation, or holds something jobreaper never writes. A write
// whose TTL is below one millisecond answers Set=false, as SetMany sends
// nothing for it. When the pipeline fails as a whole (Redis unreachable,
// the store's timeout), every write carries that error, wrapped and
// naming the operation.
func (s *MarkerWriter) MissingMany(ctx context.Context, writes []MarkerWrite) []MarkerResult {
	out := make([]MarkerResult, len(writes))
	cmds := make([]*redis.StringCmd, len(writes))
	var todo []int
	for i, w := range writes {
		if w.TTL.Milliseconds() > 0 {
			todo = append(todo, i)
		}
	}
	if len(todo) == 0 {
		return out
	}
	opCtx, done := s.op(ctx, "MissingMany")
	_, err := s.client.Pipelined(opCtx, func(p redis.Pipeliner) error {
		for _, i := range todo {
			cmds[i] = p.Get(opCtx, queue.MarkerKey(writes[i].JobID))
		}
		return nil
	})
	if err != nil && err != redis.Nil && isConnError(err) {
		err = done(err)
		for _, i := range todo {
			out[i].Err = err
		}
		return out
	}
	_ = done(nil)
	for _, i := range todo {
		held, perr := strconv.ParseInt(cmds[i].Val(), 10, 64)
		out[i].Set = cmds[i].Err() != nil || perr != nil || held < writes[i].Generation
	}
	return out
}
