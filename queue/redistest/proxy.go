package redistest

import (
	"context"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
)

// FreezingProxy forwards TCP traffic to a Redis until freeze is called;
// from then on it swallows every request, like a hung Redis whose
// connections stay open. It closes everything at cleanup.
type FreezingProxy struct {
	// Addr is the address to dial instead of the Redis.
	Addr   string
	frozen atomic.Bool
}

// NewFreezingProxy starts a FreezingProxy in front of the Redis at
// upstream.
func NewFreezingProxy(t testing.TB, upstream string) *FreezingProxy {
	t.Helper()
	var lc net.ListenConfig
	ln, err := lc.Listen(t.Context(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &FreezingProxy{Addr: ln.Addr().String()}
	var (
		mu    sync.Mutex
		conns []net.Conn
		wg    sync.WaitGroup
	)
	track := func(cs ...net.Conn) {
		mu.Lock()
		defer mu.Unlock()
		conns = append(conns, cs...)
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			down, err := ln.Accept()
			if err != nil {
				return
			}
			var d net.Dialer
			up, err := d.DialContext(context.Background(), "tcp", upstream)
			if err != nil {
				_ = down.Close()
				continue
			}
			track(down, up)
			wg.Add(2)
			go func() { // client -> Redis, dropped once frozen
				defer wg.Done()
				buf := make([]byte, 4096)
				for {
					n, err := down.Read(buf)
					if err != nil {
						return
					}
					if !p.frozen.Load() {
						if _, err := up.Write(buf[:n]); err != nil {
							return
						}
					}
				}
			}()
			go func() { // Redis -> client
				defer wg.Done()
				_, _ = io.Copy(down, up)
			}()
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		for _, c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return p
}

// Freeze makes the proxy swallow every request from now on.
func (p *FreezingProxy) Freeze() { p.frozen.Store(true) }
