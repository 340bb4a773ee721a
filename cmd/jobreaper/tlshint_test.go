package main

import (
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"

	"github.com/jobreaper/jobreaper/queue"
)

// tlsHint on a certificate that names another host: it names the address
// dialled (from the queue.TLSHandshakeError around the x509 error, even
// behind joined errors of several sentinels where another handshake failed
// first), every DNS and IP name the certificate lists, and the setting to
// use; without an address (PostgreSQL) it names the host checked.
func TestTLSHintNamesTheAddressDialledAndTheCertificatesNames(t *testing.T) {
	t.Parallel()
	cert := &x509.Certificate{DNSNames: []string{"redis.internal", "cache.internal"},
		IPAddresses: []net.IP{net.ParseIP("10.0.0.7")}}
	wrongName := &tls.CertificateVerificationError{Err: x509.HostnameError{Certificate: cert, Host: "10.0.0.8"}}
	sentinels := fmt.Errorf("redis: all sentinels specified in configuration are unreachable: %w", errors.Join(
		&queue.TLSHandshakeError{Addr: "10.0.0.9:26379", Err: errors.New("remote error: tls: handshake failure")},
		&net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connection refused")},
		&queue.TLSHandshakeError{Addr: "10.0.0.8:26379", Err: wrongName},
	))
	for _, tc := range []struct {
		name string
		err  error
		s    tlsSettings
		want []string
	}{
		{"BehindSentinels", sentinels, redisTLSSettings, []string{"the certificate of 10.0.0.8:26379 lists DNS:redis.internal, DNS:cache.internal, IP:10.0.0.7, not 10.0.0.8",
			"--redis-tls-server-name (JOBREAPER_REDIS_TLS_SERVER_NAME)"}},
		{"PostgreSQL", fmt.Errorf("connecting: %w", wrongName), postgresTLSSettings, []string{"the certificate of 10.0.0.8 lists DNS:redis.internal",
			"the host of --database-url"}},
		{"NoNamesButACommonName", x509.HostnameError{Certificate: &x509.Certificate{Subject: pkix.Name{CommonName: "old-style"}}, Host: "db"},
			postgresTLSSettings, []string{`lists no DNS or IP name (its common name "old-style" is not checked), not db`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hint := tlsHint(tc.err, tc.s)
			for _, w := range tc.want {
				if !strings.Contains(hint, w) {
					t.Errorf("tlsHint = %q, lacks %q", hint, w)
				}
			}
		})
	}
	if hint := tlsHint(errors.New("connection refused"), redisTLSSettings); hint != "" {
		t.Errorf("tlsHint of a refused connection = %q, want none", hint)
	}
}
