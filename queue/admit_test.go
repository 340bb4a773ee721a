package queue

import (
	"context"
	"net"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
)

// writeCounter counts the messages pgx flushes to PostgreSQL: one write
// per round trip (a statement whose plan pgx has cached is sent as one
// Bind/Execute/Sync and answered once).
type writeCounter struct {
	net.Conn
	writes *atomic.Int64
}

func (w writeCounter) Write(p []byte) (int, error) {
	w.writes.Add(1)
	return w.Conn.Write(p)
}

// TestGuardStartIsOneRoundTripEach starts tasks through the guard over a
// *jobs.Store and counts, before the handler runs, the statements pgx's
// tracer sees, the writes on the PostgreSQL connection, and the Redis
// commands: one of each per task start.
func TestGuardStartIsOneRoundTripEach(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := setupGuard(t)
	rt := &roundTrips{}
	var writes atomic.Int64
	cfg, err := pgxpool.ParseConfig(b.db.URL)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 1 // one connection: its statement cache is warm after the first start
	cfg.ConnConfig.Tracer = rt
	dial := cfg.ConnConfig.DialFunc
	cfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return writeCounter{Conn: c, writes: &writes}, nil
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if err := pool.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	counted := redis.NewClient(&redis.Options{Addr: b.mr.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = counted.Close() })
	counted.AddHook(rt)
	// go-redis sends its connection's handshake through the hooks once.
	if err := counted.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	markers, err := NewMarkerStore(counted)
	if err != nil {
		t.Fatal(err)
	}
	g := b.guard(t, "W1", jobs.NewStore(pool, jobs.WithSchema(b.db.Schema)), markers)

	const starts = 5
	for i := range starts + 1 {
		id := "J" + string(rune('0'+i))
		b.db.Insert(t, jobstest.Job{ID: id, Type: "report.export", Status: jobs.StatusQueued, Generation: 3})
		if i%2 == 1 {
			// A marker of an earlier life of the ID: read, not refusing.
			b.mr.Set(MarkerKey(id), "2")
		}
		pg, w, rd := rt.pgAdmit.Load(), writes.Load(), rt.redisAdmit.Load()
		var wrote, ran int64
		var lease jobs.Lease
		h := handlerFunc(func(ctx context.Context) error {
			wrote, ran = writes.Load()-w, ran+1
			lease, _ = jobs.LeaseFromContext(ctx)
			return nil
		})
		if err := deliver(ctx, g, id, h); err != nil {
			t.Fatalf("%s: guard returned %v", id, err)
		}
		if ran != 1 || lease.Generation != 4 {
			t.Fatalf("%s: handler ran %d times with lease %+v, want once at generation 4", id, ran, lease)
		}
		if n := rt.pgAdmit.Load() - pg; n != 1 {
			t.Fatalf("%s: %d PostgreSQL statements before the handler ran, want 1", id, n)
		}
		if n := rt.redisAdmit.Load() - rd; n != 1 {
			t.Fatalf("%s: %d Redis round trips before the handler ran, want 1", id, n)
		}
		// The first start prepares the statement on the connection (pgx's
		// statement cache): one more round trip, once per connection.
		if i > 0 && wrote != 1 {
			t.Fatalf("%s: %d writes to PostgreSQL before the handler ran, want 1", id, wrote)
		}
		requireRow(t, b.db, id, jobs.StatusCompleted, 4)
	}
}
