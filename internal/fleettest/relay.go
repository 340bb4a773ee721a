package fleettest

import (
	"context"
	"io"
	"math/rand/v2"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// Relay forwards TCP connections from its own loopback address to a
// server, and can be cut (listener closed, every connection dropped) and
// restored on the same address: a server that goes away for one process
// and comes back, while the shared server behind it, and every other
// process's relay, stay as they are.
type Relay struct {
	t      testing.TB
	addr   string
	target string

	mu    sync.Mutex
	ln    net.Listener
	conns map[net.Conn]bool
	wg    sync.WaitGroup
}

// StartRelay listens on a free loopback port and forwards to target
// (host:port). It is cut, and its goroutines waited for, at t's cleanup.
func StartRelay(t testing.TB, target string) *Relay {
	t.Helper()
	r := &Relay{t: t, target: target, conns: map[net.Conn]bool{}}
	ln, err := listenOutsideEphemeral()
	if err != nil {
		t.Fatal(err)
	}
	r.addr = ln.Addr().String()
	r.serve(ln)
	t.Cleanup(func() {
		r.Cut()
		r.wg.Wait()
	})
	return r
}

// listenOutsideEphemeral listens on a free loopback port below the
// kernel's ephemeral range, falling back to any free port. A relay's port
// must stay free while it is cut, to be listened on again: a port of the
// ephemeral range can meanwhile become the local port of any outgoing
// connection on the machine (a pool's connection to PostgreSQL, say) or of
// another listener on port 0, and Restore would then fail with "address
// already in use". Below the range, only another relay picking the same
// random port could take it.
func listenOutsideEphemeral() (net.Listener, error) {
	low := 32768 // Linux's default start of ip_local_port_range
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if n, err := strconv.Atoi(f[0]); err == nil {
				low = n
			}
		}
	}
	const first = 10000
	for range 200 {
		if low <= first {
			break
		}
		port := first + rand.IntN(low-first)
		ln, err := (&net.ListenConfig{}).Listen(context.Background(), "tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err == nil {
			return ln, nil
		}
	}
	return (&net.ListenConfig{}).Listen(context.Background(), "tcp", "127.0.0.1:0")
}

// RelayURL starts a relay to the server a postgres:// or redis:// URL
// names (its host and port) and returns it with the URL rewritten to go
// through it; user, database and parameters are kept.
func RelayURL(t testing.TB, raw string) (*Relay, string) {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" {
		t.Fatalf("relaying %q: not a URL naming its server as host:port (%v)", raw, err)
	}
	target := u.Host
	if u.Port() == "" {
		port := map[string]string{"postgres": "5432", "postgresql": "5432", "redis": "6379"}[u.Scheme]
		if port == "" {
			t.Fatalf("relaying %q: no port, and none known for scheme %q", raw, u.Scheme)
		}
		target = net.JoinHostPort(u.Hostname(), port)
	}
	r := StartRelay(t, target)
	u.Host = r.addr
	return r, u.String()
}

// Addr is the relay's own address (127.0.0.1:port), the same after a
// Restore.
func (r *Relay) Addr() string { return r.addr }

func (r *Relay) serve(ln net.Listener) {
	r.mu.Lock()
	r.ln = ln
	r.mu.Unlock()
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			r.wg.Add(1)
			go func() {
				defer r.wg.Done()
				r.forward(c)
			}()
		}
	}()
}

func (r *Relay) forward(c net.Conn) {
	up, err := (&net.Dialer{}).Dial("tcp", r.target)
	if err != nil {
		_ = c.Close()
		return
	}
	r.mu.Lock()
	if r.ln == nil { // cut meanwhile
		r.mu.Unlock()
		_ = c.Close()
		_ = up.Close()
		return
	}
	r.conns[c], r.conns[up] = true, true
	r.mu.Unlock()
	var once sync.Once
	closeBoth := func() { once.Do(func() { _ = c.Close(); _ = up.Close() }) }
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); _, _ = io.Copy(up, c); closeBoth() }()
	go func() { defer wg.Done(); _, _ = io.Copy(c, up); closeBoth() }()
	wg.Wait()
	r.mu.Lock()
	delete(r.conns, c)
	delete(r.conns, up)
	r.mu.Unlock()
}

// Cut stops accepting and drops every open connection: the process behind
// the relay sees its server go away (connection reset, then refused).
func (r *Relay) Cut() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ln != nil {
		_ = r.ln.Close()
		r.ln = nil
	}
	for c := range r.conns {
		_ = c.Close()
	}
}

// Restore listens again on the relay's address after a Cut.
func (r *Relay) Restore() {
	r.t.Helper()
	// The port is below the ephemeral range (listenOutsideEphemeral); a
	// socket closing on it may still hold it for a moment.
	var (
		ln  net.Listener
		err error
	)
	for end := time.Now().Add(5 * time.Second); ; time.Sleep(pollEvery) {
		ln, err = (&net.ListenConfig{}).Listen(context.Background(), "tcp", r.addr)
		if err == nil || time.Now().After(end) {
			break
		}
	}
	if err != nil {
		r.t.Fatalf("listening again on %s: %v", r.addr, err)
	}
	r.serve(ln)
}
