package main

import (
	"context"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
)

// tcpProxy forwards connections from its own address to a target, and can
// be cut (listener closed, every connection dropped) and restored on the
// same address: a dependency that goes away and comes back, without
// touching the shared server behind it.
type tcpProxy struct {
	t      *testing.T
	addr   string
	target string

	mu    sync.Mutex
	ln    net.Listener
	conns map[net.Conn]bool
	wg    sync.WaitGroup
}

// startProxy listens on a free loopback port and forwards to target; it is
// cut at cleanup.
func startProxy(t *testing.T, target string) *tcpProxy {
	t.Helper()
	p := &tcpProxy{t: t, target: target, conns: map[net.Conn]bool{}}
	ln, err := (&net.ListenConfig{}).Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p.addr = ln.Addr().String()
	p.serve(ln)
	t.Cleanup(func() {
		p.cut()
		p.wg.Wait()
	})
	return p
}

// proxyPostgres starts a proxy to the PostgreSQL server of databaseURL
// and returns it with databaseURL rewritten to go through it: the test
// cuts the proxy, never the shared server.
func proxyPostgres(t *testing.T, databaseURL string) (*tcpProxy, string) {
	t.Helper()
	cfg, err := pgx.ParseConfig(databaseURL)
	if err != nil {
		t.Fatal(err)
	}
	server := cfg.Host + ":" + strconv.Itoa(int(cfg.Port))
	if !strings.Contains(databaseURL, server) {
		t.Fatalf("database URL %s does not name its server as %s", databaseURL, server)
	}
	p := startProxy(t, server)
	return p, strings.Replace(databaseURL, server, p.addr, 1)
}

func (p *tcpProxy) serve(ln net.Listener) {
	p.mu.Lock()
	p.ln = ln
	p.mu.Unlock()
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			p.wg.Add(1)
			go func() {
				defer p.wg.Done()
				p.forward(c)
			}()
		}
	}()
}

func (p *tcpProxy) forward(c net.Conn) {
	up, err := (&net.Dialer{}).Dial("tcp", p.target)
	if err != nil {
		_ = c.Close()
		return
	}
	p.mu.Lock()
	if p.ln == nil { // cut meanwhile
		p.mu.Unlock()
		_ = c.Close()
		_ = up.Close()
		return
	}
	p.conns[c], p.conns[up] = true, true
	p.mu.Unlock()
	var once sync.Once
	closeBoth := func() { once.Do(func() { _ = c.Close(); _ = up.Close() }) }
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); _, _ = io.Copy(up, c); closeBoth() }()
	go func() { defer wg.Done(); _, _ = io.Copy(c, up); closeBoth() }()
	wg.Wait()
	p.mu.Lock()
	delete(p.conns, c)
	delete(p.conns, up)
	p.mu.Unlock()
}

// cut stops accepting and drops every open connection.
func (p *tcpProxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln != nil {
		_ = p.ln.Close()
		p.ln = nil
	}
	for c := range p.conns {
		_ = c.Close()
	}
}

// restore listens again on the proxy's address.
func (p *tcpProxy) restore() {
	p.t.Helper()
	ln, err := (&net.ListenConfig{}).Listen(context.Background(), "tcp", p.addr)
	if err != nil {
		p.t.Fatalf("listening again on %s: %v", p.addr, err)
	}
	p.serve(ln)
}
