package queue

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"math/big"
	"net"
	"sync"
	"testing"
	"time"
)

// tlsTestCA is a throwaway CA that signs server certificates in memory.
type tlsTestCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pool *x509.CertPool
}

func newTLSTestCA(t *testing.T) tlsTestCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "throwaway CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return tlsTestCA{cert: cert, key: key, pool: pool}
}

// serve listens with TLS on a free port of ip, with a certificate naming
// only ip, completes each handshake and closes the connection; it returns
// the address. Everything stops at cleanup.
func (ca tlsTestCA) serve(t *testing.T, ip string) string {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: ip},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IPAddresses: []net.IP{net.ParseIP(ip)}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	l, err := tls.Listen("tcp", net.JoinHostPort(ip, "0"), &tls.Config{
		Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}})
	if err != nil {
		t.Fatalf("listening on %s: %v", ip, err)
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			_ = c.(*tls.Conn).Handshake() // a refused client ends it early
			_ = c.Close()
		}
	})
	t.Cleanup(func() { _ = l.Close(); wg.Wait() })
	return l.Addr().String()
}

// tlsDialer verifies each connection against the host of the address it
// dialled, whatever ServerName the shared config carries (go-redis's
// Sentinel and Cluster URL parsers put the first host there); with a
// server name it verifies that name for every address, and a certificate
// that does not name it fails with a *TLSHandshakeError naming the address
// and wrapping x509.HostnameError.
func TestTLSDialerVerifiesTheAddressDialled(t *testing.T) {
	t.Parallel()
	ca := newTLSTestCA(t)
	first, second := ca.serve(t, "127.0.0.1"), ca.serve(t, "127.0.0.2")
	base := &tls.Config{RootCAs: ca.pool, ServerName: "127.0.0.1", MinVersion: tls.VersionTLS12}

	dial := tlsDialer(base, "")
	for _, addr := range []string{first, second} {
		c, err := dial(t.Context(), "tcp", addr)
		if err != nil {
			t.Fatalf("dialling %s: %v", addr, err)
		}
		_ = c.Close()
	}
	if base.ServerName != "127.0.0.1" {
		t.Fatalf("the shared config was changed: ServerName %q", base.ServerName)
	}

	_, err := tlsDialer(base, "redis.internal")(t.Context(), "tcp", second)
	var hs *TLSHandshakeError
	var host x509.HostnameError
	if !errors.As(err, &hs) || hs.Addr != second || !errors.As(err, &host) || host.Host != "redis.internal" {
		t.Fatalf("dialling %s as redis.internal: %v, want a TLSHandshakeError naming it around an x509.HostnameError", second, err)
	}
}
