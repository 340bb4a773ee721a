package queue

import (
	"context"
	"crypto/tls"
	"net"
	"time"
)

// redisKeepAlive is the TCP keep-alive of each connection tlsDialer opens,
// the one go-redis's own dialers use: probe after 30 s idle (below common
// load balancer and NAT idle timeouts), then give the peer up after 3
// unanswered probes 5 s apart.
var redisKeepAlive = net.KeepAliveConfig{Enable: true, Idle: 30 * time.Second, Interval: 5 * time.Second, Count: 3}

// tlsDialer returns a go-redis Dialer that opens every connection with
// TLS and verifies the certificate against the host of the address it
// dialled, or against serverName for every node when serverName is set.
//
// go-redis's own dialers hand every node of a topology one tls.Config,
// whose ServerName ParseFailoverURL and ParseClusterURL set to the first
// host of the URL: the primary a sentinel names, its replicas and every
// cluster node would be verified as the first sentinel or seed, and a
// certificate naming the node's own address refused. go-redis calls a
// custom Dialer with the address of the node it connects to (sentinels,
// the primary or a replica the sentinels announce, each cluster node).
//
// base's other fields (RootCAs, MinVersion, InsecureSkipVerify from the
// URL's skip_verify) apply to every connection. The dial and the handshake
// are bounded by ctx, to which go-redis's pool gives the DialTimeout of
// each attempt. A failed handshake is returned as a *TLSHandshakeError
// naming the address dialled. Not a *net.OpError: go-redis retries a
// command whose error has a Timeout method, true or false, and a
// certificate that does not verify will not verify on a retry (behind
// Sentinel the nested retries outlast the caller's deadline, and the
// cause is lost to "context deadline exceeded").
func tlsDialer(base *tls.Config, serverName string) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		cfg := base.Clone()
		cfg.ServerName = serverName
		if cfg.ServerName == "" {
			host, _, err := net.SplitHostPort(addr)
			if err != nil {
				host = addr
			}
			cfg.ServerName = host
		}
		d := net.Dialer{KeepAliveConfig: redisKeepAlive}
		raw, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		conn := tls.Client(raw, cfg)
		if err := conn.HandshakeContext(ctx); err != nil {
			_ = raw.Close()
			return nil, &TLSHandshakeError{Addr: addr, Err: err}
		}
		return conn, nil
	}
}

// TLSHandshakeError is the error of a connection to a rediss:// node
// whose TLS handshake failed, from a client NewRedisClient built. With
// Sentinel or Cluster the node that refused is often not the URL's host,
// so the error names it.
type TLSHandshakeError struct {
	// Addr is the address dialled, host:port as go-redis dialled it: the
	// URL's host, a sentinel, the primary or a replica a sentinel
	// announced, or a cluster node.
	Addr string
	// Err is the TLS error; errors.As finds in it the crypto/x509 error
	// of a certificate that does not verify (x509.HostnameError for one
	// that names another host, x509.UnknownAuthorityError for one of an
	// unknown CA).
	Err error
}

// Error returns "TLS handshake with <Addr>: <Err>".
func (e *TLSHandshakeError) Error() string {
	return "TLS handshake with " + e.Addr + ": " + e.Err.Error()
}

// Unwrap returns Err.
func (e *TLSHandshakeError) Unwrap() error { return e.Err }
