package asynqstate

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jobreaper/jobreaper/queue"
)

func TestMarkerWriterSetMany(t *testing.T) {
	t.Parallel()

	t.Run("EachWriteIsItsOwnCompareAndSet", func(t *testing.T) {
		t.Parallel()
		mr, mc := miniRedis(t)
		s := NewMarkerWriter(mc, 0)
		// This Redis has not cached the script yet: it answers NOSCRIPT to
		// the first EVALSHA, and SetMany sends the script's text.
		if err := mr.Set(queue.MarkerKey("garbage"), "not-a-number"); err != nil {
			t.Fatal(err)
		}
		if err := mr.Set(queue.MarkerKey("newer"), "5"); err != nil {
			t.Fatal(err)
		}
		got := s.SetMany(t.Context(), []MarkerWrite{
			{JobID: "a", Generation: 2, TTL: queue.MarkerTTL},
			{JobID: "garbage", Generation: 1, TTL: queue.MarkerTTL},
			{JobID: "newer", Generation: 3, TTL: queue.MarkerTTL},
			{JobID: "expired", Generation: 1, TTL: 0},
			{JobID: "b", Generation: 1, TTL: time.Hour},
		})
		if !got[0].Set || got[0].Err != nil || !got[4].Set || got[4].Err != nil {
			t.Fatalf("writes a and b = %+v, %+v; want both set", got[0], got[4])
		}
		if got[1].Set || !errors.Is(got[1].Err, queue.ErrBadMarker) {
			t.Fatalf("write over garbage = %+v, want queue.ErrBadMarker", got[1])
		}
		if got[2].Set || got[2].Err != nil || got[3].Set || got[3].Err != nil {
			t.Fatalf("writes under a newer marker and past their TTL = %+v, %+v; want not set, no error", got[2], got[3])
		}
		if v, _ := mr.Get(queue.MarkerKey("a")); v != "2" || mr.TTL(queue.MarkerKey("a")) != queue.MarkerTTL {
			t.Fatalf("marker a = %q ttl %v, want 2 with %v", v, mr.TTL(queue.MarkerKey("a")), queue.MarkerTTL)
		}
		if v, _ := mr.Get(queue.MarkerKey("newer")); v != "5" {
			t.Fatalf("newer marker = %q, want 5 kept", v)
		}
		if mr.Exists(queue.MarkerKey("expired")) {
			t.Fatal("a marker past its 7 days was written")
		}
	})

	t.Run("RedisDownFailsEveryWrite", func(t *testing.T) {
		t.Parallel()
		mr, mc := miniRedis(t)
		s := NewMarkerWriter(mc, time.Second)
		mr.Close()
		got := s.SetMany(t.Context(), []MarkerWrite{{JobID: "a", Generation: 1, TTL: queue.MarkerTTL}, {JobID: "b", Generation: 1, TTL: queue.MarkerTTL}})
		for i, r := range got {
			if r.Set || r.Err == nil {
				t.Fatalf("write %d with Redis down = %+v, want an error", i, r)
			}
		}
	})
}

// ReassertMany answers as SetMany does, and writes nothing over a marker
// that holds the generation or a newer one: its value and TTL stay.
func TestMarkerWriterReassertMany(t *testing.T) {
	t.Parallel()

	t.Run("WritesOnlyWhatIsNotThere", func(t *testing.T) {
		t.Parallel()
		mr, mc := miniRedis(t)
		s := NewMarkerWriter(mc, 0)
		for key, v := range map[string]string{"same": "3", "older": "1", "newer": "5", "garbage": "not-a-number"} {
			if err := mr.Set(queue.MarkerKey(key), v); err != nil {
				t.Fatal(err)
			}
			mr.SetTTL(queue.MarkerKey(key), 2*time.Hour)
		}
		got := s.ReassertMany(t.Context(), []MarkerWrite{
			{JobID: "same", Generation: 3, TTL: queue.MarkerTTL},
			{JobID: "older", Generation: 2, TTL: time.Hour},
			{JobID: "newer", Generation: 3, TTL: queue.MarkerTTL},
			{JobID: "missing", Generation: 4, TTL: time.Hour},
			{JobID: "garbage", Generation: 1, TTL: queue.MarkerTTL},
			{JobID: "expired", Generation: 1, TTL: 0},
		})
		want := []struct {
			set bool
			bad bool
		}{{false, false}, {true, false}, {false, false}, {true, false}, {false, true}, {false, false}}
		for i, w := range want {
			if got[i].Set != w.set || errors.Is(got[i].Err, queue.ErrBadMarker) != w.bad || (!w.bad && got[i].Err != nil) {
				t.Errorf("write %d = %+v, want set %v, queue.ErrBadMarker %v", i, got[i], w.set, w.bad)
			}
		}
		for key, want := range map[string]string{"same": "3", "newer": "5", "older": "2", "missing": "4", "garbage": "not-a-number"} {
			if v, _ := mr.Get(queue.MarkerKey(key)); v != want {
				t.Errorf("marker %s = %q, want %q", key, v, want)
			}
		}
		// The markers found there keep their TTL: a re-assertion never
		// extends one.
		for _, key := range []string{"same", "newer"} {
			if ttl := mr.TTL(queue.MarkerKey(key)); ttl != 2*time.Hour {
				t.Errorf("marker %s TTL = %v, want its 2h kept", key, ttl)
			}
		}
		if ttl := mr.TTL(queue.MarkerKey("missing")); ttl != time.Hour {
			t.Errorf("restored marker TTL = %v, want the 1h left", ttl)
		}
		if mr.Exists(queue.MarkerKey("expired")) {
			t.Error("a marker past its 7 days was written")
		}
	})

	t.Run("RedisDownFailsEveryWrite", func(t *testing.T) {
		t.Parallel()
		mr, mc := miniRedis(t)
		s := NewMarkerWriter(mc, time.Second)
		mr.Close()
		got := s.ReassertMany(t.Context(), []MarkerWrite{{JobID: "a", Generation: 1, TTL: queue.MarkerTTL}, {JobID: "b", Generation: 1, TTL: queue.MarkerTTL}})
		for i, r := range got {
			if r.Set || r.Err == nil || errors.Is(r.Err, queue.ErrBadMarker) {
				t.Errorf("write %d with Redis down = %+v, want a Redis error", i, r)
			}
		}
	})
}

// MissingMany says which markers SetMany would have to write, and writes
// none: a pass that holds its marker writes counts them this way.
func TestMarkerWriterMissingMany(t *testing.T) {
	t.Parallel()

	t.Run("SaysWhatIsNotThereAndWritesNothing", func(t *testing.T) {
		t.Parallel()
		mr, mc := miniRedis(t)
		s := NewMarkerWriter(mc, 0)
		for key, v := range map[string]string{"same": "3", "older": "1", "newer": "5", "garbage": "not-a-number"} {
			if err := mr.Set(queue.MarkerKey(key), v); err != nil {
				t.Fatal(err)
			}
		}
		got := s.MissingMany(t.Context(), []MarkerWrite{
			{JobID: "same", Generation: 3, TTL: queue.MarkerTTL},
			{JobID: "older", Generation: 2, TTL: time.Hour},
			{JobID: "newer", Generation: 3, TTL: queue.MarkerTTL},
			{JobID: "missing", Generation: 4, TTL: time.Hour},
			{JobID: "garbage", Generation: 1, TTL: queue.MarkerTTL},
			{JobID: "expired", Generation: 1, TTL: 0},
		})
		for i, want := range []bool{false, true, false, true, true, false} {
			if got[i].Set != want || got[i].Err != nil {
				t.Errorf("write %d = %+v, want set %v and no error", i, got[i], want)
			}
		}
		for key, want := range map[string]string{"same": "3", "older": "1", "newer": "5", "garbage": "not-a-number"} {
			if v, _ := mr.Get(queue.MarkerKey(key)); v != want {
				t.Errorf("marker %s = %q, want %q kept", key, v, want)
			}
		}
		for _, key := range []string{"missing", "expired"} {
			if mr.Exists(queue.MarkerKey(key)) {
				t.Errorf("marker %s was written", key)
			}
		}
	})

	t.Run("RedisDownFailsEveryRead", func(t *testing.T) {
		t.Parallel()
		mr, mc := miniRedis(t)
		s := NewMarkerWriter(mc, time.Second)
		mr.Close()
		got := s.MissingMany(t.Context(), []MarkerWrite{{JobID: "a", Generation: 1, TTL: queue.MarkerTTL}, {JobID: "b", Generation: 1, TTL: queue.MarkerTTL}})
		for i, r := range got {
			if r.Set || r.Err == nil || !strings.Contains(r.Err.Error(), "asynqstate.MarkerWriter.MissingMany") {
				t.Errorf("read %d with Redis down = %+v, want an error naming asynqstate.MarkerWriter.MissingMany", i, r)
			}
		}
	})
}
