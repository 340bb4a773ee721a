package queue

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

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
// gets its own result: one key holding garbage (ErrBadMarker) fails only
// that write. When the pipeline itself fails (Redis unreachable, the
// timeout), every write carries that error. A write whose TTL is below one
// millisecond is not sent and answers Set=false.
func (s *MarkerStore) SetMany(ctx context.Context, writes []MarkerWrite) []MarkerResult {
	out := make([]MarkerResult, len(writes))
	ctx, done := s.op(ctx, "SetMany")
	cmds := make([]*redis.Cmd, len(writes))
	run := func(useEval bool, which []int) error {
		_, err := s.client.Pipelined(ctx, func(p redis.Pipeliner) error {
			for _, i := range which {
				w := writes[i]
				keys, gen, ms := []string{MarkerKey(w.JobID)}, strconv.FormatInt(w.Generation, 10), w.TTL.Milliseconds()
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
		key := MarkerKey(writes[i].JobID)
		switch {
		case err != nil:
			out[i].Err = fmt.Errorf("queue.MarkerStore.SetMany: key %s: %w", key, err)
		case n == 1:
			out[i].Set = true
		case n == -1:
			out[i].Err = fmt.Errorf("queue.MarkerStore.SetMany: key %s: %w", key, ErrBadMarker)
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
// the compare-and-set then reports as ErrBadMarker). Re-asserting markers
// that are almost always there so costs a GET each instead of a script
// each. A marker that changes between the read and the write is still
// judged by the compare-and-set. When the read pipeline fails as a whole
// (Redis unreachable, the timeout), every write carries that error.
func (s *MarkerStore) ReassertMany(ctx context.Context, writes []MarkerWrite) []MarkerResult {
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
func (s *MarkerStore) MissingMany(ctx context.Context, writes []MarkerWrite) []MarkerResult {
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
			cmds[i] = p.Get(opCtx, MarkerKey(writes[i].JobID))
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
