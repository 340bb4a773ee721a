package queue

import (
	"context"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/jobreaper/jobreaper/queue/redistest"
)

// The guard's reader of markers. The writes (the reaper's compare-and-set)
// are internal/asynqstate's MarkerWriter, tested there with this reader.
func TestMarkerStore(t *testing.T) {
	t.Parallel()

	setup := func(t *testing.T) (*MarkerStore, *miniredis.Miniredis) {
		t.Helper()
		mr, c := miniRedis(t)
		s, err := NewMarkerStore(c)
		if err != nil {
			t.Fatalf("NewMarkerStore: %v", err)
		}
		return s, mr
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

	t.Run("KeyIsThePrefixAndTheJobID", func(t *testing.T) {
		t.Parallel()
		if got := MarkerKey("J5"); got != "jobreaper:reaped:J5" {
			t.Fatalf("MarkerKey(J5) = %q, want jobreaper:reaped:J5", got)
		}
		if MarkerTTL != 604800*time.Second {
			t.Fatalf("MarkerTTL = %s, want 604800s", MarkerTTL)
		}
	})

	t.Run("ValueIsReadAsTheGenerationItRecords", func(t *testing.T) {
		t.Parallel()
		s, mr := setup(t)
		if err := mr.Set("jobreaper:reaped:J1", "42"); err != nil {
			t.Fatal(err)
		}
		requireMarker(t, s, "J1", 42, true)
	})

	t.Run("MissingMarkerIsNotFoundWithoutError", func(t *testing.T) {
		t.Parallel()
		s, _ := setup(t)
		requireMarker(t, s, "nobody", 0, false)
	})

	t.Run("UnparsableValueIsAnErrorNamingTheKey", func(t *testing.T) {
		t.Parallel()
		s, mr := setup(t)
		if err := mr.Set("jobreaper:reaped:J1", "garbage"); err != nil {
			t.Fatal(err)
		}
		_, _, err := s.Get(t.Context(), "J1")
		if !errors.Is(err, ErrBadMarker) || !strings.Contains(err.Error(), "jobreaper:reaped:J1") {
			t.Fatalf("Get of a non-numeric marker: err = %v, want ErrBadMarker naming jobreaper:reaped:J1", err)
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
		s, err := NewMarkerStore(c, WithMarkerOpTimeout(100*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		// One call through a healthy Redis opens the connection; then Redis
		// stops answering.
		requireMarker(t, s, "J1", 0, false)
		proxy.Freeze()

		start := time.Now()
		_, _, err = s.Get(t.Context(), "J1")
		if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "queue.MarkerStore.Get timed out after 100ms") {
			t.Fatalf("Get against a hung Redis: err = %v, want \"queue.MarkerStore.Get timed out after 100ms\" wrapping context.DeadlineExceeded", err)
		}
		if took := time.Since(start); took > 2*time.Second {
			t.Fatalf("Get against a hung Redis returned after %s, want about 100ms", took)
		}
	})

	t.Run("CancelledCallerIsNotReportedAsATimeout", func(t *testing.T) {
		t.Parallel()
		s, _ := setup(t)
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

	t.Run("StoreOnlyReads", func(t *testing.T) {
		t.Parallel()
		// Only expiry removes a marker (case B22), and only the reaper
		// writes one. Guard the API against a Delete or a write creeping in.
		typ := reflect.TypeOf(&MarkerStore{})
		var names []string
		for i := range typ.NumMethod() {
			names = append(names, typ.Method(i).Name)
		}
		if strings.Join(names, ",") != "Get" {
			t.Fatalf("MarkerStore methods = %v, want exactly [Get]: the guard only reads markers", names)
		}
	})
}
