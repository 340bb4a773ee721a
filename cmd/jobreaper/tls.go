package main

import (
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/jobreaper/jobreaper/config"
	"github.com/jobreaper/jobreaper/queue"
)

// redisRoots returns the certificate authorities of cfg.RedisCAFile, to
// trust for a rediss:// URL; nil without a CA file (go-redis then trusts
// the system's roots). Errors, exit code 2, name the file: unreadable, or
// holding no PEM certificate.
func redisRoots(cfg config.Config) (*x509.CertPool, error) {
	if cfg.RedisCAFile == "" {
		return nil, nil
	}
	pem, err := os.ReadFile(cfg.RedisCAFile)
	if err != nil {
		return nil, cannotRun("cannot read redis_ca_file %s: %v; check --redis-ca-file (JOBREAPER_REDIS_CA_FILE)", cfg.RedisCAFile, errors.Unwrap(err))
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, cannotRun("redis_ca_file %s holds no PEM certificate; check --redis-ca-file (JOBREAPER_REDIS_CA_FILE)", cfg.RedisCAFile)
	}
	return pool, nil
}

// tlsSettings names, for tlsHint, what an operator sets to fix a failed
// verification of a server's certificate.
type tlsSettings struct {
	// ca is where the trusted CAs come from.
	ca string
	// name is what to do about a certificate that does not name the host
	// it was checked against.
	name string
}

var (
	// redisTLSSettings are --redis-ca-file and --redis-tls-server-name.
	redisTLSSettings = tlsSettings{ca: "--redis-ca-file (JOBREAPER_REDIS_CA_FILE)",
		name: "set --redis-tls-server-name (JOBREAPER_REDIS_TLS_SERVER_NAME) to a name it lists"}
	// postgresTLSSettings are libpq's parameters in the database URL.
	postgresTLSSettings = tlsSettings{ca: "sslrootcert=<CA file> in --database-url",
		name: "connect by a name it lists (the host of --database-url)"}
)

// tlsHint says what to check when err is a failed verification of a
// server's certificate, for the message of a failed connection; "" for any
// other error. For a certificate that names another host it names the
// address dialled and every name the certificate lists, since with
// Sentinel or Cluster the server that refused is not the URL's host.
func tlsHint(err error, s tlsSettings) string {
	var unknown x509.UnknownAuthorityError
	var invalid x509.CertificateInvalidError
	if host, addr, ok := hostnameFailure(err); ok {
		return fmt.Sprintf("the certificate of %s lists %s, not %s: %s, or give that server a certificate that names %s",
			addr, certNames(host.Certificate), host.Host, s.name, host.Host)
	}
	switch {
	case errors.As(err, &unknown):
		return fmt.Sprintf("the server's certificate is not signed by a trusted CA: set %s to the CA that signed it", s.ca)
	case errors.As(err, &invalid):
		return "the server's certificate is not valid (expired, or not for server use)"
	}
	return ""
}

// hostnameFailure finds in err's tree an x509.HostnameError and the
// address that was dialled: the Addr of the *queue.TLSHandshakeError
// around it, else the host the certificate was checked against. It walks
// the tree itself, since a joined error (several sentinels) may hold other
// handshake errors first.
func hostnameFailure(err error) (x509.HostnameError, string, bool) {
	var he x509.HostnameError
	if hs, ok := err.(*queue.TLSHandshakeError); ok && errors.As(hs.Err, &he) {
		return he, hs.Addr, true
	}
	if he, ok := err.(x509.HostnameError); ok {
		return he, he.Host, true
	}
	switch u := err.(type) {
	case interface{ Unwrap() []error }:
		for _, e := range u.Unwrap() {
			if he, addr, ok := hostnameFailure(e); ok {
				return he, addr, true
			}
		}
	case interface{ Unwrap() error }:
		if e := u.Unwrap(); e != nil {
			return hostnameFailure(e)
		}
	}
	return he, "", false
}

// certNames lists the names cert is valid for, as openssl prints them
// ("DNS:redis.internal, IP:10.0.0.7").
func certNames(cert *x509.Certificate) string {
	if cert == nil {
		return "names we cannot show (no certificate in the error)"
	}
	var names []string
	for _, n := range cert.DNSNames {
		names = append(names, "DNS:"+n)
	}
	for _, ip := range cert.IPAddresses {
		names = append(names, "IP:"+ip.String())
	}
	if len(names) == 0 {
		// Go checks only these names; the common name is not one.
		return fmt.Sprintf("no DNS or IP name (its common name %q is not checked)", cert.Subject.CommonName)
	}
	return strings.Join(names, ", ")
}
