package jobstest

import (
	"bytes"
	"context"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Cuttable is a pool over a test's schema whose way to PostgreSQL can be
// cut and restored, as one process sees a network outage while the
// database and every other process go on: while cut, every new
// connection is refused (or, after Hang, waits) and the connections the
// pool held are closed, so statements in flight fail as on a reset
// connection. No relay is involved: the pool's own dial function refuses.
type Cuttable struct {
	// Pool is the pool to hand to the code under test.
	Pool *pgxpool.Pool

	mode       atomic.Int32 // cutOpen, cutRefuse or cutHang
	refused    atomic.Int64
	held       atomic.Int64
	loseCommit atomic.Bool

	mu       sync.Mutex
	conns    map[net.Conn]struct{}
	restored chan struct{} // closed by Restore; replaced by each Cut or Hang
}

const (
	cutOpen int32 = iota
	cutRefuse
	cutHang
)

// Cuttable returns a pool over d's schema (the URL's search_path) that
// starts open and is closed at cleanup. Each of configure adjusts the
// pool's configuration first (pgstore.ConnWatch.Install: the daemon's
// tracer).
func (d *DB) Cuttable(t testing.TB, configure ...func(*pgxpool.Config)) *Cuttable {
	t.Helper()
	return NewCuttable(t, d.URL, configure...)
}

// NewCuttable is DB.Cuttable for any database URL (a cluster the test
// started itself).
func NewCuttable(t testing.TB, url string, configure ...func(*pgxpool.Config)) *Cuttable {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range configure {
		c(cfg)
	}
	c := &Cuttable{conns: map[net.Conn]struct{}{}, restored: make(chan struct{})}
	close(c.restored)
	dial := cfg.ConnConfig.DialFunc
	cfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		for {
			c.mu.Lock()
			mode, restored := c.mode.Load(), c.restored
			c.mu.Unlock()
			switch mode {
			case cutRefuse:
				c.refused.Add(1)
				return nil, &net.OpError{Op: "dial", Net: network, Err: syscall.ECONNREFUSED}
			case cutHang:
				c.held.Add(1)
				select {
				case <-restored:
					c.held.Add(-1)
					continue
				case <-ctx.Done():
					c.held.Add(-1)
					return nil, &net.OpError{Op: "dial", Net: network, Err: ctx.Err()}
				}
			}
			conn, err := dial(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			c.mu.Lock()
			c.conns[conn] = struct{}{}
			c.mu.Unlock()
			return &trackedConn{Conn: conn, owner: c}, nil
		}
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	c.Pool = pool
	t.Cleanup(func() {
		c.Restore()
		pool.Close()
	})
	return c
}

// Cut refuses every new connection from now on (ECONNREFUSED, as a
// database host that is down) and closes the connections the pool holds,
// idle or in use.
func (c *Cuttable) Cut() { c.cut(cutRefuse) }

// Hang makes every new connection wait until Restore or the dial's own
// context ends (a partition that drops packets), and closes the
// connections the pool holds.
func (c *Cuttable) Hang() { c.cut(cutHang) }

func (c *Cuttable) cut(mode int32) {
	c.mu.Lock()
	if c.mode.Load() == cutOpen {
		c.restored = make(chan struct{})
	}
	c.mode.Store(mode)
	conns := make([]net.Conn, 0, len(c.conns))
	for conn := range c.conns {
		conns = append(conns, conn)
	}
	c.mu.Unlock()
	for _, conn := range conns {
		_ = conn.Close()
	}
	c.Pool.Reset()
}

// Restore lets connections through again; dials that Hang held go on.
func (c *Cuttable) Restore() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.mode.Load() != cutOpen {
		c.mode.Store(cutOpen)
		close(c.restored)
	}
}

// LoseNextCommitAnswer makes the next COMMIT any of the pool's connections
// sends reach PostgreSQL, and then closes that connection before the
// answer can be read: the transaction commits, and the client sees a broken
// connection (a COMMIT whose outcome is unknown to it).
func (c *Cuttable) LoseNextCommitAnswer() { c.loseCommit.Store(true) }

// Refused returns how many connections were refused while cut.
func (c *Cuttable) Refused() int64 { return c.refused.Load() }

// Held returns how many dials Hang holds right now.
func (c *Cuttable) Held() int64 { return c.held.Load() }

// trackedConn removes itself from its owner's set when closed.
type trackedConn struct {
	net.Conn
	owner *Cuttable
}

// commitMessage is how pgx sends a transaction's COMMIT: a simple query
// whose text is "commit".
var commitMessage = []byte("commit\x00")

func (t *trackedConn) Write(p []byte) (int, error) {
	n, err := t.Conn.Write(p)
	if err == nil && bytes.Contains(p, commitMessage) && t.owner.loseCommit.CompareAndSwap(true, false) {
		_ = t.Close()
	}
	return n, err
}

func (t *trackedConn) Close() error {
	t.owner.mu.Lock()
	delete(t.owner.conns, t.Conn)
	t.owner.mu.Unlock()
	return t.Conn.Close()
}
