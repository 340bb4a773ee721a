package asynqstate

import (
	"context"
	"errors"
	"math"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jobreaper/jobreaper/queue"
)

// FuzzMarkerValueReadAlikeByGetAndSet writes any value under a marker key
// of the real Redis (as another tool sharing it might), then reads it with
// the guard's queue.MarkerStore.Get (Go) and writes over it with
// MarkerWriter.Set (the Lua compare-and-set that runs inside Redis): both must read the value alike. A value Get refuses as
// queue.ErrBadMarker is refused by Set too and left as it is; a value Get reads
// as generation g is overwritten by Set exactly when Set's generation is
// greater than g.
func FuzzMarkerValueReadAlikeByGetAndSet(f *testing.F) {
	for _, v := range []string{"1", "7", "0", "007", "yes", "", " 5", "5 ", "5.0", "+5", "-5", "0x10", "1e3", "inf", "nan",
		"9223372036854775807", "9223372036854775808", "99999999999999999999", "١٢", "5\x00"} {
		f.Add(v, int64(7))
	}
	// Doubles cannot tell these apart (2^53 and 2^53 + 1).
	f.Add("9007199254740992", int64(9007199254740993))
	rc := realRedis(f)
	r, err := queue.NewMarkerStore(rc)
	if err != nil {
		f.Fatal(err)
	}
	w := NewMarkerWriter(rc, 0)
	prefix := unique(f, "fuzz-marker-")
	var n atomic.Int64
	f.Fuzz(func(t *testing.T, stored string, gen int64) {
		ctx := context.Background()
		if gen < 0 { // generations count claims from 0
			gen = -(gen + 1)
		}
		id := prefix + "-" + strconv.FormatInt(n.Add(1), 10)
		key := queue.MarkerKey(id)
		defer rc.Del(context.Background(), key)
		if err := rc.Set(ctx, key, stored, time.Minute).Err(); err != nil {
			t.Fatal(err)
		}
		g, found, getErr := r.Get(ctx, id)
		set, setErr := w.Set(ctx, id, gen, time.Minute)
		after, err := rc.Get(ctx, key).Result()
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case errors.Is(getErr, queue.ErrBadMarker):
			if !errors.Is(setErr, queue.ErrBadMarker) || set || after != stored {
				t.Fatalf("value %q: Get refuses it (%v), but Set(%d) = %v, %v and left %q", stored, getErr, gen, set, setErr, after)
			}
		case getErr != nil || !found:
			t.Fatalf("value %q: Get = %d, %v, %v", stored, g, found, getErr)
		case setErr != nil:
			t.Fatalf("value %q: Get reads generation %d, but Set(%d) fails: %v", stored, g, gen, setErr)
		case gen > g:
			if !set || after != strconv.FormatInt(gen, 10) {
				t.Fatalf("value %q (generation %d for Get): Set(%d) = %v and left %q, want the newer generation written", stored, g, gen, set, after)
			}
		default:
			if set || after != stored {
				t.Fatalf("value %q (generation %d for Get): Set(%d) = %v and left %q, want it kept", stored, g, gen, set, after)
			}
		}
		if found && (g < 0 || g == math.MinInt64) {
			t.Fatalf("value %q: Get reads generation %d; generations are never negative", stored, g)
		}
	})
}
