package asynqstate

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"
)

// redisAddrDefault is the real Redis the Inspector and asynq.Server tests
// use when JOBREAPER_TEST_REDIS_ADDR is unset. Tests use queue names and
// job IDs unique to each test, so they share it safely.
const redisAddrDefault = "127.0.0.1:6379"

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// realRedis returns a client of the real test Redis, closed at cleanup. It
// fails the test (never skips it) when Redis is not reachable.
func realRedis(t testing.TB) *redis.Client {
	t.Helper()
	addr := cmp.Or(os.Getenv("JOBREAPER_TEST_REDIS_ADDR"), redisAddrDefault)
	c := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("Redis for tests is not reachable at %s (%v); start it (redis-server --port 6379) or set JOBREAPER_TEST_REDIS_ADDR", addr, err)
	}
	return c
}

// miniRedis starts a miniredis and returns it with a client, both closed
// at cleanup.
func miniRedis(t testing.TB) (*miniredis.Miniredis, *redis.Client) {
	t.Helper()
	mr := miniredis.RunT(t)
	c := redis.NewClient(&redis.Options{Addr: mr.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	return mr, c
}

// unique returns prefix + a name derived from the test + a random suffix,
// for queue names and job IDs shared Redis must not mix up.
func unique(t testing.TB, prefix string) string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	name := strings.NewReplacer("/", "-", " ", "-").Replace(t.Name())
	if len(name) > 60 {
		name = name[len(name)-60:]
	}
	return prefix + name + "-" + hex.EncodeToString(b[:])
}

// asynqLogger silences asynq's own logger in tests (its Warn lines about
// retries and archives are expected here).
type asynqLogger struct{}

func (asynqLogger) Debug(...any) {}
func (asynqLogger) Info(...any)  {}
func (asynqLogger) Warn(...any)  {}
func (asynqLogger) Error(...any) {}
func (asynqLogger) Fatal(...any) {}

// startServer runs an asynq.Server on client for queue with handler and
// shuts it down at cleanup, after release (if any) was closed.
func startServer(t testing.TB, client redis.UniversalClient, queue string, cfg asynq.Config, handler asynq.Handler) {
	t.Helper()
	cfg.Queues = map[string]int{queue: 1}
	cfg.Logger = asynqLogger{}
	if cfg.Concurrency == 0 {
		cfg.Concurrency = 5
	}
	srv := asynq.NewServerFromRedisClient(client, cfg)
	if err := srv.Start(handler); err != nil {
		t.Fatalf("starting asynq server: %v", err)
	}
	t.Cleanup(srv.Shutdown)
}

// deleteQueueAtCleanup removes queue and its tasks from the real Redis at
// cleanup (registered first, so it runs after the server's shutdown), then
// the statistics keys DeleteQueue leaves behind.
func deleteQueueAtCleanup(t testing.TB, rc *redis.Client, queue string) {
	t.Cleanup(func() {
		insp := asynq.NewInspectorFromRedisClient(rc)
		if err := insp.DeleteQueue(queue, true); err != nil && !errors.Is(err, asynq.ErrQueueNotFound) {
			t.Errorf("deleting test queue %s: %v", queue, err)
		}
		ctx := context.Background()
		iter := rc.Scan(ctx, 0, "asynq:{"+queue+"}:*", 100).Iterator()
		for iter.Next(ctx) {
			_ = rc.Del(ctx, iter.Val()).Err()
		}
		if err := iter.Err(); err != nil {
			t.Errorf("removing keys of test queue %s: %v", queue, err)
		}
	})
}
