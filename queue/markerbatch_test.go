package queue

import (
	"errors"
	"testing"
	"time"
)

func TestMarkerStoreSetMany(t *testing.T) {
	t.Parallel()

	t.Run("EachWriteIsItsOwnCompareAndSet", func(t *testing.T) {
		t.Parallel()
		mr, mc := miniRedis(t)
		s, err := NewMarkerStore(mc)
		if err != nil {
			t.Fatal(err)
		}
		// This Redis has not cached the script yet: it answers NOSCRIPT to
		// the first EVALSHA, and SetMany sends the script's text.
		if err := mr.Set(MarkerKey("garbage"), "not-a-number"); err != nil {
			t.Fatal(err)
		}
		if err := mr.Set(MarkerKey("newer"), "5"); err != nil {
			t.Fatal(err)
		}
		got := s.SetMany(t.Context(), []MarkerWrite{
			{JobID: "a", Generation: 2, TTL: MarkerTTL},
			{JobID: "garbage", Generation: 1, TTL: MarkerTTL},
			{JobID: "newer", Generation: 3, TTL: MarkerTTL},
			{JobID: "expired", Generation: 1, TTL: 0},
			{JobID: "b", Generation: 1, TTL: time.Hour},
		})
		if !got[0].Set || got[0].Err != nil || !got[4].Set || got[4].Err != nil {
			t.Fatalf("writes a and b = %+v, %+v; want both set", got[0], got[4])
		}
		if got[1].Set || !errors.Is(got[1].Err, ErrBadMarker) {
			t.Fatalf("write over garbage = %+v, want ErrBadMarker", got[1])
		}
		if got[2].Set || got[2].Err != nil || got[3].Set || got[3].Err != nil {
			t.Fatalf("writes under a newer marker and past their TTL = %+v, %+v; want not set, no error", got[2], got[3])
		}
		if v, _ := mr.Get(MarkerKey("a")); v != "2" || mr.TTL(MarkerKey("a")) != MarkerTTL {
			t.Fatalf("marker a = %q ttl %v, want 2 with %v", v, mr.TTL(MarkerKey("a")), MarkerTTL)
		}
		if v, _ := mr.Get(MarkerKey("newer")); v != "5" {
			t.Fatalf("newer marker = %q, want 5 kept", v)
		}
		if mr.Exists(MarkerKey("expired")) {
			t.Fatal("a marker past its 7 days was written")
		}
	})

	t.Run("RedisDownFailsEveryWrite", func(t *testing.T) {
		t.Parallel()
		mr, mc := miniRedis(t)
		s, err := NewMarkerStore(mc, WithMarkerOpTimeout(time.Second))
		if err != nil {
			t.Fatal(err)
		}
		mr.Close()
		got := s.SetMany(t.Context(), []MarkerWrite{{JobID: "a", Generation: 1, TTL: MarkerTTL}, {JobID: "b", Generation: 1, TTL: MarkerTTL}})
		for i, r := range got {
			if r.Set || r.Err == nil {
				t.Fatalf("write %d with Redis down = %+v, want an error", i, r)
			}
		}
	})
}
