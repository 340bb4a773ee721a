package main

import (
	"crypto/x509"
	"errors"
	"fmt"
	"os"

	"github.com/jobreaper/jobreaper/config"
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

// tlsHint says what to check when err is a failed verification of the
// server's certificate, for the message of a failed connection; "" for any
// other error. setting names where the trusted CAs come from.
func tlsHint(err error, setting string) string {
	var unknown x509.UnknownAuthorityError
	var host x509.HostnameError
	var invalid x509.CertificateInvalidError
	switch {
	case errors.As(err, &unknown):
		return fmt.Sprintf("the server's certificate is not signed by a trusted CA: set %s to the CA that signed it", setting)
	case errors.As(err, &host):
		return "the server's certificate does not name the host of the URL: connect by a name the certificate lists"
	case errors.As(err, &invalid):
		return "the server's certificate is not valid (expired, or not for server use)"
	}
	return ""
}
