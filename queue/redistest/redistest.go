// Package redistest starts a redis-server of a test's own, on a free port
// of the loopback interface, for tests that must change its configuration,
// stop it or lose its data: the shared Redis other tests use is never
// touched that way.
package redistest

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Server is a running redis-server owned by one test.
type Server struct {
	// Addr is host:port of the server.
	Addr string
	// URL is a redis:// URL of its database 0.
	URL string
	cmd *exec.Cmd
}

// Start runs redis-server with no persistence on a free port, with args
// appended to its command line (for example "--maxmemory-policy",
// "volatile-lru"), waits until it answers PING, and stops it at cleanup.
// It fails the test when redis-server is not installed or does not start.
func Start(t testing.TB, args ...string) *Server {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatalf("redis-server is not installed (%v): install Debian's redis-server package", err)
	}
	port := freePort(t)
	all := append([]string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--dir", t.TempDir(), "--loglevel", "warning"}, args...)
	cmd := exec.Command(bin, all...)
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting redis-server: %v", err)
	}
	s := &Server{Addr: fmt.Sprintf("127.0.0.1:%d", port), cmd: cmd}
	s.URL = "redis://" + s.Addr + "/0"
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	c := s.Client(t)
	deadline := time.Now().Add(15 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := c.Ping(ctx).Err()
		cancel()
		if err == nil {
			return s
		}
		if time.Now().After(deadline) {
			t.Fatalf("redis-server on %s did not answer PING within 15s: %v", s.Addr, err)
		}
		time.Sleep(20 * time.Millisecond) // polling for the server to listen
	}
}

// Client returns a client of database 0 with ContextTimeoutEnabled, closed
// at cleanup.
func (s *Server) Client(t testing.TB) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: s.Addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("finding a free port: %v", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
