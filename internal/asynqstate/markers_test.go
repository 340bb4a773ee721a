package asynqstate

import (
	"context"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/queue"
	"github.com/jobreaper/jobreaper/queue/redistest"
)

// TestMarkerWriter holds the reaper's marker writes, read back through the
// guard's reader (queue.MarkerStore).
func TestMarkerWriter(t *testing.T) {
	t.Parallel()

	setup := func(t *testing.T) (*MarkerWriter, *queue.MarkerStore, *miniredis.Miniredis, *redis.Client) {
		t.Helper()
		mr, c := miniRedis(t)
		r, err := queue.NewMarkerStore(c)
		if err != nil {
			t.Fatalf("NewMarkerStore: %v", err)
		}
		return NewMarkerWriter(c, 0), r, mr, c
	}
	mustSet := func(t *testing.T, s *MarkerWriter, id string, gen int64, ttl time.Duration, want bool) {
		t.Helper()
		got, err := s.Set(t.Context(), id, gen, ttl)
		if err != nil {
			t.Fatalf("Set(%s, %d, %s): %v", id, gen, ttl, err)
		}
		if got != want {
			t.Fatalf("Set(%s, %d, %s) = %v, want %v", id, gen, ttl, got, want)
		}
	}
	requireMarker := func(t *testing.T, s *queue.MarkerStore, id string, wantGen int64, wantFound bool) {
		t.Helper()
		gen, found, err := s.Get(t.Context(), id)
		if err != nil {
			t.Fatalf("Get(%s): %v", id, err)
		}
		if found != wantFound || gen != wantGen {
			t.Fatalf("Get(%s) = generation %d found %v, want generation %d found %v", id, gen, found, wantGen, wantFound)
		}
	}
	ttlSeconds := func(t *testing.T, c *redis.Client, id string) float64 {
		t.Helper()
		// PTTL through the client, as an operator would see it: -1 would
		// mean a marker without expiry, -2 no marker.
		d, err := c.PTTL(t.Context(), queue.MarkerKey(id)).Result()
		if err != nil {
			t.Fatalf("PTTL %s: %v", queue.MarkerKey(id), err)
		}
		return d.Seconds()
	}

	t.Run("MarkerIsPresentAtSevenDaysMinusOneSecondAndGoneAtSevenDaysPlusOne", func(t *testing.T) {
		t.Parallel()
		s, r, mr, _ := setup(t)
		mustSet(t, s, "J1", 1, queue.MarkerTTL, true)
		mr.FastForward(queue.MarkerTTL - time.Second)
		requireMarker(t, r, "J1", 1, true)
		mr.FastForward(2 * time.Second)
		requireMarker(t, r, "J1", 0, false)
		if mr.Exists(queue.MarkerKey("J1")) {
			t.Fatalf("key %s still exists at 7 days + 1 s", queue.MarkerKey("J1"))
		}
	})

	t.Run("FreshSetHasATTLOfSevenDays", func(t *testing.T) {
		t.Parallel()
		s, _, _, c := setup(t)
		mustSet(t, s, "J1", 1, queue.MarkerTTL, true)
		if got := ttlSeconds(t, c, "J1"); got <= 604790 || got > 604800 {
			t.Fatalf("TTL after Set = %.3f s, want in (604790, 604800]", got)
		}
	})

	t.Run("RetriedSetWithTheSameGenerationDoesNotExtendTheTTL", func(t *testing.T) {
		t.Parallel()
		s, r, mr, c := setup(t)
		mustSet(t, s, "J1", 1, queue.MarkerTTL, true)
		mr.FastForward(time.Hour)
		mustSet(t, s, "J1", 1, queue.MarkerTTL, false)
		want := (queue.MarkerTTL - time.Hour).Seconds() // 601200
		if got := ttlSeconds(t, c, "J1"); got <= want-10 || got > want {
			t.Fatalf("TTL after a retried Set 1 h later = %.3f s, want in (%.0f, %.0f]", got, want-10, want)
		}
		requireMarker(t, r, "J1", 1, true)
	})

	t.Run("NewerGenerationReplacesAnOlderOneWithItsOwnTTL", func(t *testing.T) {
		t.Parallel()
		s, r, mr, c := setup(t)
		mustSet(t, s, "J1", 1, queue.MarkerTTL, true)
		mr.FastForward(48 * time.Hour)
		mustSet(t, s, "J1", 2, queue.MarkerTTL, true)
		requireMarker(t, r, "J1", 2, true)
		if got := ttlSeconds(t, c, "J1"); got <= 604790 || got > 604800 {
			t.Fatalf("TTL after the generation 2 reap = %.3f s, want a fresh 7 days in (604790, 604800]", got)
		}
	})

	t.Run("OlderGenerationDoesNotReplaceANewerOne", func(t *testing.T) {
		t.Parallel()
		s, r, mr, c := setup(t)
		mustSet(t, s, "J1", 3, queue.MarkerTTL, true)
		mr.FastForward(time.Hour)
		mustSet(t, s, "J1", 2, queue.MarkerTTL, false)
		requireMarker(t, r, "J1", 3, true)
		want := (queue.MarkerTTL - time.Hour).Seconds()
		if got := ttlSeconds(t, c, "J1"); got <= want-10 || got > want {
			t.Fatalf("TTL after an older Set = %.3f s, want unchanged in (%.0f, %.0f]", got, want-10, want)
		}
	})

	t.Run("TTLOfZeroOrLessWritesNothing", func(t *testing.T) {
		t.Parallel()
		s, _, mr, _ := setup(t)
		for _, ttl := range []time.Duration{0, -time.Hour, 500 * time.Microsecond} {
			mustSet(t, s, "J1", 1, ttl, false)
		}
		if mr.Exists(queue.MarkerKey("J1")) {
			t.Fatalf("Set with ttl <= 0 wrote %s", queue.MarkerKey("J1"))
		}
	})

	t.Run("ValueRecordsTheGenerationAsADecimalString", func(t *testing.T) {
		t.Parallel()
		s, r, mr, _ := setup(t)
		mustSet(t, s, "J1", 42, queue.MarkerTTL, true)
		if v, err := mr.Get("jobreaper:reaped:J1"); err != nil || v != "42" {
			t.Fatalf("value of jobreaper:reaped:J1 = %q (%v), want \"42\"", v, err)
		}
		requireMarker(t, r, "J1", 42, true)
	})

	t.Run("RepairLongAfterTheReapGetsOnlyTheRestOfTheSevenDays", func(t *testing.T) {
		t.Parallel()
		s, _, _, c := setup(t)
		reap := time.Date(2025, 3, 1, 10, 31, 0, 0, time.UTC)
		rest := MarkerRemaining(reap, reap.Add(6*24*time.Hour))
		if rest != 24*time.Hour {
			t.Fatalf("MarkerRemaining 6 days after the reap = %s, want 24h", rest)
		}
		mustSet(t, s, "J1", 1, rest, true)
		if got := ttlSeconds(t, c, "J1"); got <= 86390 || got > 86400 {
			t.Fatalf("TTL of a repaired marker = %.3f s, want in (86390, 86400]", got)
		}
		if got := MarkerRemaining(reap, reap.Add(queue.MarkerTTL+time.Second)); got > 0 {
			t.Fatalf("MarkerRemaining after 7 days = %s, want <= 0", got)
		}
	})

	t.Run("UnparsableValueIsAnErrorNamingTheKey", func(t *testing.T) {
		t.Parallel()
		s, _, mr, _ := setup(t)
		if err := mr.Set("jobreaper:reaped:J1", "garbage"); err != nil {
			t.Fatal(err)
		}
		_, err := s.Set(t.Context(), "J1", 1, queue.MarkerTTL)
		if !errors.Is(err, queue.ErrBadMarker) || !strings.Contains(err.Error(), "jobreaper:reaped:J1") {
			t.Fatalf("Set over a non-numeric marker: err = %v, want queue.ErrBadMarker naming jobreaper:reaped:J1", err)
		}
		if v, _ := mr.Get("jobreaper:reaped:J1"); v != "garbage" {
			t.Fatalf("Set overwrote a foreign value with %q", v)
		}
	})

	t.Run("HungRedisCallTimesOutNamingTheOperation", func(t *testing.T) {
		t.Parallel()
		mr := miniredis.RunT(t)
		proxy := redistest.NewFreezingProxy(t, mr.Addr())
		// Without ContextTimeoutEnabled go-redis ignores context deadlines
		// and only its ReadTimeout (5 s) would end the call.
		c := redis.NewClient(&redis.Options{Addr: proxy.Addr, MaxRetries: -1, PoolSize: 1, ContextTimeoutEnabled: true})
		t.Cleanup(func() { _ = c.Close() })
		s := NewMarkerWriter(c, 100*time.Millisecond)
		// One call through a healthy Redis opens the connection; then Redis
		// stops answering.
		mustSet(t, s, "J0", 1, time.Minute, true)
		proxy.Freeze()

		start := time.Now()
		_, err := s.Set(t.Context(), "J1", 1, queue.MarkerTTL)
		if took := time.Since(start); took > 2*time.Second {
			t.Fatalf("Set against a hung Redis returned after %s, want about 100ms", took)
		}
		if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "asynqstate.MarkerWriter.Set timed out after 100ms") {
			t.Fatalf("Set against a hung Redis: err = %v, want \"asynqstate.MarkerWriter.Set timed out after 100ms\" wrapping context.DeadlineExceeded", err)
		}
	})

	t.Run("WriterHasNoWayToDeleteAMarker", func(t *testing.T) {
		t.Parallel()
		// Only expiry removes a marker (case B22). Guard the API against
		// a Delete creeping in.
		typ := reflect.TypeOf(&MarkerWriter{})
		var names []string
		for i := range typ.NumMethod() {
			names = append(names, typ.Method(i).Name)
		}
		if strings.Join(names, ",") != "MissingMany,ReassertMany,Set,SetMany" {
			t.Fatalf("MarkerWriter methods = %v, want exactly [MissingMany ReassertMany Set SetMany]", names)
		}
	})
}

// A negative generation is refused before anything is sent: no claim ever
// makes one, and the compare-and-set reads only digits.
func TestMarkerSetRefusesANegativeGeneration(t *testing.T) {
	t.Parallel()
	mr, c := miniRedis(t)
	s := NewMarkerWriter(c, 0)
	if set, err := s.Set(t.Context(), "J", -1, queue.MarkerTTL); set || !errors.Is(err, jobs.ErrInvalidArgument) {
		t.Fatalf("Set(-1) = %v, %v; want an error wrapping jobs.ErrInvalidArgument", set, err)
	}
	res := s.SetMany(t.Context(), []MarkerWrite{{JobID: "J", Generation: -1, TTL: queue.MarkerTTL}, {JobID: "K", Generation: 1, TTL: queue.MarkerTTL}})
	if !errors.Is(res[0].Err, jobs.ErrInvalidArgument) || res[1].Err != nil || !res[1].Set {
		t.Fatalf("SetMany = %+v; want J refused, K written", res)
	}
	if mr.Exists(queue.MarkerKey("J")) {
		t.Fatal("a marker was written for the negative generation")
	}
}
