package asynqstate

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jobreaper/jobreaper/queue"
)

// A marker key someone else wrote (B38's "yes", or a hash) is one bad item:
// the reaper's marker writer names the key and wraps queue.ErrBadMarker, and
// leaves the value as it is, on the real Redis.
func TestMarkerWriteOverAnotherToolsKeyIsABadMarker(t *testing.T) {
	t.Parallel()
	rc := realRedis(t)
	s := NewMarkerWriter(rc, 0)
	str, hash := unique(t, "X-str-"), unique(t, "X-hash-")
	t.Cleanup(func() { rc.Del(context.Background(), queue.MarkerKey(str), queue.MarkerKey(hash)) })
	if err := rc.Set(t.Context(), queue.MarkerKey(str), "yes", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	if err := rc.HSet(t.Context(), queue.MarkerKey(hash), "reaped", "1").Err(); err != nil {
		t.Fatal(err)
	}
	rc.Expire(t.Context(), queue.MarkerKey(hash), time.Minute)
	for _, id := range []string{str, hash} {
		_, err := s.Set(t.Context(), id, 1, queue.MarkerTTL)
		if !errors.Is(err, queue.ErrBadMarker) || !strings.Contains(err.Error(), queue.MarkerKey(id)) {
			t.Fatalf("Set over %s: err = %v, want queue.ErrBadMarker naming the key", queue.MarkerKey(id), err)
		}
	}
	if v, _ := rc.Get(t.Context(), queue.MarkerKey(str)).Result(); v != "yes" {
		t.Fatalf("the foreign value was overwritten with %q", v)
	}
}
