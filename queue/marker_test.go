package queue

import (
	"context"
	"errors"
	"io"
	"net"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/jobreaper/jobreaper/jobs"
)

func TestMarkerStore(t *testing.T) {
	t.Parallel()

	setup := func(t *testing.T) (*MarkerStore, *miniredis.Miniredis, *redis.Client) {
		t.Helper()
		mr, c := miniRedis(t)
		s, err := NewMarkerStore(c)
		if err != nil {
			t.Fatalf("NewMarkerStore: %v", err)
		}
		return s, mr, c
	}
	mustSet := func(t *testing.T, s *MarkerStore, id string, gen int64, ttl time.Duration, want bool) {
		t.Helper()
		got, err := s.Set(t.Context(), id, gen, ttl)
		if err != nil {
			t.Fatalf("Set(%s, %d, %s): %v", id, gen, ttl, err)
		}
		if got != want {
			t.Fatalf("Set(%s, %d, %s) = %v, want %v", id, gen, ttl, got, want)
		}
	}
	requireMarker := func(t *testing.T, s *MarkerStore, id string, wantGen int64, wantFound bool) {
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
		d, err := c.PTTL(t.Context(), MarkerKey(id)).Result()
		if err != nil {
			t.Fatalf("PTTL %s: %v", MarkerKey(id), err)
		}
		return d.Seconds()
	}

	t.Run("KeyIsThePrefixAndTheJobID", func(t *testing.T) {
		t.Parallel()
		if got := MarkerKey("J5"); got != "jobreaper:reaped:J5" {
			t.Fatalf("MarkerKey(J5) = %q, want jobreaper:reaped:J5", got)
		}
		if MarkerTTL != 604800*time.Second {
			t.Fatalf("MarkerTTL = %s, want 604800s", MarkerTTL)
		}
	})

	t.Run("MarkerIsPresentAtSevenDaysMinusOneSecondAndGoneAtSevenDaysPlusOne", func(t *testing.T) {
		t.Parallel()
		s, mr, _ := setup(t)
		mustSet(t, s, "J1", 1, MarkerTTL, true)
		mr.FastForward(MarkerTTL - time.Second)
		requireMarker(t, s, "J1", 1, true)
		mr.FastForward(2 * time.Second)
		requireMarker(t, s, "J1", 0, false)
		if mr.Exists(MarkerKey("J1")) {
			t.Fatalf("key %s still exists at 7 days + 1 s", MarkerKey("J1"))
		}
	})

	t.Run("FreshSetHasATTLOfSevenDays", func(t *testing.T) {
		t.Parallel()
		s, _, c := setup(t)
		mustSet(t, s, "J1", 1, MarkerTTL, true)
		if got := ttlSeconds(t, c, "J1"); got <= 604790 || got > 604800 {
			t.Fatalf("TTL after Set = %.3f s, want in (604790, 604800]", got)
		}
	})

	t.Run("RetriedSetWithTheSameGenerationDoesNotExtendTheTTL", func(t *testing.T) {
		t.Parallel()
		s, mr, c := setup(t)
		mustSet(t, s, "J1", 1, MarkerTTL, true)
		mr.FastForward(time.Hour)
		mustSet(t, s, "J1", 1, MarkerTTL, false)
		want := (MarkerTTL - time.Hour).Seconds() // 601200
		if got := ttlSeconds(t, c, "J1"); got <= want-10 || got > want {
			t.Fatalf("TTL after a retried Set 1 h later = %.3f s, want in (%.0f, %.0f]", got, want-10, want)
		}
		requireMarker(t, s, "J1", 1, true)
	})

	t.Run("NewerGenerationReplacesAnOlderOneWithItsOwnTTL", func(t *testing.T) {
		t.Parallel()
		s, mr, c := setup(t)
		mustSet(t, s, "J1", 1, MarkerTTL, true)
		mr.FastForward(48 * time.Hour)
		mustSet(t, s, "J1", 2, MarkerTTL, true)
		requireMarker(t, s, "J1", 2, true)
		if got := ttlSeconds(t, c, "J1"); got <= 604790 || got > 604800 {
			t.Fatalf("TTL after the generation 2 reap = %.3f s, want a fresh 7 days in (604790, 604800]", got)
		}
	})

	t.Run("OlderGenerationDoesNotReplaceANewerOne", func(t *testing.T) {
		t.Parallel()
		s, mr, c := setup(t)
		mustSet(t, s, "J1", 3, MarkerTTL, true)
		mr.FastForward(time.Hour)
		mustSet(t, s, "J1", 2, MarkerTTL, false)
		requireMarker(t, s, "J1", 3, true)
		want := (MarkerTTL - time.Hour).Seconds()
		if got := ttlSeconds(t, c, "J1"); got <= want-10 || got > want {
			t.Fatalf("TTL after an older Set = %.3f s, want unchanged in (%.0f, %.0f]", got, want-10, want)
		}
	})

	t.Run("TTLOfZeroOrLessWritesNothing", func(t *testing.T) {
		t.Parallel()
		s, mr, _ := setup(t)
		for _, ttl := range []time.Duration{0, -time.Hour, 500 * time.Microsecond} {
			mustSet(t, s, "J1", 1, ttl, false)
		}
		if mr.Exists(MarkerKey("J1")) {
			t.Fatalf("Set with ttl <= 0 wrote %s", MarkerKey("J1"))
		}
	})

	t.Run("ValueRecordsTheGenerationAsADecimalString", func(t *testing.T) {
		t.Parallel()
		s, mr, _ := setup(t)
		mustSet(t, s, "J1", 42, MarkerTTL, true)
		if v, err := mr.Get("jobreaper:reaped:J1"); err != nil || v != "42" {
			t.Fatalf("value of jobreaper:reaped:J1 = %q (%v), want \"42\"", v, err)
		}
		requireMarker(t, s, "J1", 42, true)
	})

	t.Run("RepairLongAfterTheReapGetsOnlyTheRestOfTheSevenDays", func(t *testing.T) {
		t.Parallel()
		s, _, c := setup(t)
		reap := time.Date(2025, 3, 1, 10, 31, 0, 0, time.UTC)
		rest := MarkerRemaining(reap, reap.Add(6*24*time.Hour))
		if rest != 24*time.Hour {
			t.Fatalf("MarkerRemaining 6 days after the reap = %s, want 24h", rest)
		}
		mustSet(t, s, "J1", 1, rest, true)
		if got := ttlSeconds(t, c, "J1"); got <= 86390 || got > 86400 {
			t.Fatalf("TTL of a repaired marker = %.3f s, want in (86390, 86400]", got)
		}
		if got := MarkerRemaining(reap, reap.Add(MarkerTTL+time.Second)); got > 0 {
			t.Fatalf("MarkerRemaining after 7 days = %s, want <= 0", got)
		}
	})

	t.Run("MissingMarkerIsNotFoundWithoutError", func(t *testing.T) {
		t.Parallel()
		s, _, _ := setup(t)
		requireMarker(t, s, "nobody", 0, false)
	})

	t.Run("UnparsableValueIsAnErrorNamingTheKey", func(t *testing.T) {
		t.Parallel()
		s, mr, _ := setup(t)
		if err := mr.Set("jobreaper:reaped:J1", "garbage"); err != nil {
			t.Fatal(err)
		}
		_, _, err := s.Get(t.Context(), "J1")
		if !errors.Is(err, ErrBadMarker) || !strings.Contains(err.Error(), "jobreaper:reaped:J1") {
			t.Fatalf("Get of a non-numeric marker: err = %v, want ErrBadMarker naming jobreaper:reaped:J1", err)
		}
		_, err = s.Set(t.Context(), "J1", 1, MarkerTTL)
		if !errors.Is(err, ErrBadMarker) || !strings.Contains(err.Error(), "jobreaper:reaped:J1") {
			t.Fatalf("Set over a non-numeric marker: err = %v, want ErrBadMarker naming jobreaper:reaped:J1", err)
		}
		if v, _ := mr.Get("jobreaper:reaped:J1"); v != "garbage" {
			t.Fatalf("Set overwrote a foreign value with %q", v)
		}
	})

	t.Run("HungRedisCallTimesOutNamingTheOperation", func(t *testing.T) {
		t.Parallel()
		mr := miniredis.RunT(t)
		proxy := newFreezingProxy(t, mr.Addr())
		// Without ContextTimeoutEnabled go-redis ignores context deadlines
		// and only its ReadTimeout (5 s) would end the call.
		c := redis.NewClient(&redis.Options{Addr: proxy.addr, MaxRetries: -1, PoolSize: 1, ContextTimeoutEnabled: true})
		t.Cleanup(func() { _ = c.Close() })
		s, err := NewMarkerStore(c, WithMarkerOpTimeout(100*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		// One call through a healthy Redis opens the connection; then Redis
		// stops answering.
		requireMarker(t, s, "J1", 0, false)
		proxy.freeze()

		start := time.Now()
		_, _, err = s.Get(t.Context(), "J1")
		if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "queue.MarkerStore.Get timed out after 100ms") {
			t.Fatalf("Get against a hung Redis: err = %v, want \"queue.MarkerStore.Get timed out after 100ms\" wrapping context.DeadlineExceeded", err)
		}
		if took := time.Since(start); took > 2*time.Second {
			t.Fatalf("Get against a hung Redis returned after %s, want about 100ms", took)
		}
		_, err = s.Set(t.Context(), "J1", 1, MarkerTTL)
		if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "queue.MarkerStore.Set timed out after 100ms") {
			t.Fatalf("Set against a hung Redis: err = %v, want \"queue.MarkerStore.Set timed out after 100ms\" wrapping context.DeadlineExceeded", err)
		}
	})

	t.Run("CancelledCallerIsNotReportedAsATimeout", func(t *testing.T) {
		t.Parallel()
		s, _, _ := setup(t)
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		_, _, err := s.Get(ctx, "J1")
		if !errors.Is(err, context.Canceled) || strings.Contains(err.Error(), "timed out") || !strings.Contains(err.Error(), "queue.MarkerStore.Get") {
			t.Fatalf("Get with a cancelled context: err = %v, want queue.MarkerStore.Get wrapping context.Canceled, not a timeout", err)
		}
	})

	t.Run("NonPositiveTimeoutIsRefused", func(t *testing.T) {
		t.Parallel()
		_, c := miniRedis(t)
		_, err := NewMarkerStore(c, WithMarkerOpTimeout(0))
		if !errors.Is(err, ErrBadOption) || !strings.Contains(err.Error(), "WithMarkerOpTimeout(0s)") {
			t.Fatalf("NewMarkerStore(WithMarkerOpTimeout(0)): err = %v, want ErrBadOption naming the option and value", err)
		}
	})

	t.Run("StoreHasNoWayToDeleteAMarker", func(t *testing.T) {
		t.Parallel()
		// Only expiry removes a marker (case B22). Guard the API against
		// a Delete creeping in.
		typ := reflect.TypeOf(&MarkerStore{})
		var names []string
		for i := range typ.NumMethod() {
			names = append(names, typ.Method(i).Name)
		}
		if strings.Join(names, ",") != "Get,MissingMany,ReassertMany,Set,SetMany" {
			t.Fatalf("MarkerStore methods = %v, want exactly [Get MissingMany ReassertMany Set SetMany]", names)
		}
	})
}

// freezingProxy forwards TCP traffic to a Redis until freeze is called;
// from then on it swallows every request, like a hung Redis whose
// connections stay open. It closes everything at cleanup.
type freezingProxy struct {
	addr   string
	frozen atomic.Bool
}

func newFreezingProxy(t *testing.T, upstream string) *freezingProxy {
	t.Helper()
	var lc net.ListenConfig
	ln, err := lc.Listen(t.Context(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &freezingProxy{addr: ln.Addr().String()}
	var (
		mu    sync.Mutex
		conns []net.Conn
		wg    sync.WaitGroup
	)
	track := func(cs ...net.Conn) {
		mu.Lock()
		defer mu.Unlock()
		conns = append(conns, cs...)
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			down, err := ln.Accept()
			if err != nil {
				return
			}
			var d net.Dialer
			up, err := d.DialContext(context.Background(), "tcp", upstream)
			if err != nil {
				_ = down.Close()
				continue
			}
			track(down, up)
			wg.Add(2)
			go func() { // client -> Redis, dropped once frozen
				defer wg.Done()
				buf := make([]byte, 4096)
				for {
					n, err := down.Read(buf)
					if err != nil {
						return
					}
					if !p.frozen.Load() {
						if _, err := up.Write(buf[:n]); err != nil {
							return
						}
					}
				}
			}()
			go func() { // Redis -> client
				defer wg.Done()
				_, _ = io.Copy(down, up)
			}()
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		for _, c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return p
}

func (p *freezingProxy) freeze() { p.frozen.Store(true) }

// A negative generation is refused before anything is sent: no claim ever
// makes one, and the compare-and-set reads only digits.
func TestMarkerSetRefusesANegativeGeneration(t *testing.T) {
	t.Parallel()
	mr, c := miniRedis(t)
	s, err := NewMarkerStore(c)
	if err != nil {
		t.Fatal(err)
	}
	if set, err := s.Set(t.Context(), "J", -1, MarkerTTL); set || !errors.Is(err, jobs.ErrInvalidArgument) {
		t.Fatalf("Set(-1) = %v, %v; want an error wrapping jobs.ErrInvalidArgument", set, err)
	}
	res := s.SetMany(t.Context(), []MarkerWrite{{JobID: "J", Generation: -1, TTL: MarkerTTL}, {JobID: "K", Generation: 1, TTL: MarkerTTL}})
	if !errors.Is(res[0].Err, jobs.ErrInvalidArgument) || res[1].Err != nil || !res[1].Set {
		t.Fatalf("SetMany = %+v; want J refused, K written", res)
	}
	if mr.Exists(MarkerKey("J")) {
		t.Fatal("a marker was written for the negative generation")
	}
}
