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
	"sync"
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

	bin  string
	args []string

	mu  sync.Mutex
	cmd *exec.Cmd // nil while stopped
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
	s := &Server{Addr: fmt.Sprintf("127.0.0.1:%d", port), bin: bin, args: all}
	s.URL = "redis://" + s.Addr + "/0"
	t.Cleanup(s.kill)
	s.start(t)
	return s
}

// start runs the server process and waits until it answers PING.
func (s *Server) start(t testing.TB) {
	t.Helper()
	cmd := exec.Command(s.bin, s.args...)
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting redis-server: %v", err)
	}
	s.mu.Lock()
	s.cmd = cmd
	s.mu.Unlock()
	c := redis.NewClient(&redis.Options{Addr: s.Addr, ContextTimeoutEnabled: true})
	defer c.Close()
	deadline := time.Now().Add(15 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := c.Ping(ctx).Err()
		cancel()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("redis-server on %s did not answer PING within 15s: %v", s.Addr, err)
		}
		time.Sleep(20 * time.Millisecond) // polling for the server to listen
	}
}

// kill ends the server process, if it runs, and waits for it.
func (s *Server) kill() {
	s.mu.Lock()
	cmd := s.cmd
	s.cmd = nil
	s.mu.Unlock()
	if cmd != nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}
}

// Stop shuts the server down as an operator's SHUTDOWN SAVE does: it saves
// its data to disk (although the server runs without save points), closes
// every client connection and exits. Stop waits for the process to exit;
// Restart brings the server back with its data. It fails the test when the
// server is not running or does not exit within 30 s.
func (s *Server) Stop(t testing.TB) {
	t.Helper()
	s.mu.Lock()
	cmd := s.cmd
	s.cmd = nil
	s.mu.Unlock()
	if cmd == nil {
		t.Fatalf("redis-server on %s: Stop while stopped", s.Addr)
	}
	c := redis.NewClient(&redis.Options{Addr: s.Addr, ContextTimeoutEnabled: true})
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// SHUTDOWN answers nothing when it succeeds: the connection just closes.
	_ = c.Do(ctx, "SHUTDOWN", "SAVE").Err()
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	select {
	case <-exited:
	case <-ctx.Done():
		_ = cmd.Process.Kill()
		<-exited
		t.Fatalf("redis-server on %s did not exit within 30s of SHUTDOWN SAVE", s.Addr)
	}
}

// Restart starts a stopped server again on the same address, directory
// and arguments, so it loads the data Stop saved, and waits until it
// answers PING.
func (s *Server) Restart(t testing.TB) {
	t.Helper()
	s.mu.Lock()
	running := s.cmd != nil
	s.mu.Unlock()
	if running {
		t.Fatalf("redis-server on %s: Restart while running", s.Addr)
	}
	s.start(t)
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
