package queue

import (
	"crypto/x509"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/jobreaper/jobreaper/internal/redact"
)

// ErrBadRedisURL is wrapped by ParseRedisURL's errors.
var ErrBadRedisURL = errors.New("invalid Redis URL")

// Redis topologies ParseRedisURL tells apart.
const (
	TopologySingle   = "single"
	TopologySentinel = "sentinel"
	TopologyCluster  = "cluster"
)

// RedisClientOptions adjusts the client NewRedisClient builds, whatever
// the topology.
type RedisClientOptions struct {
	// RootCAs are the CAs trusted for a rediss:// URL; nil keeps the
	// system's roots.
	RootCAs *x509.CertPool
	// OpTimeout is the dial, read and write timeout of each call; 0 keeps
	// go-redis's defaults (5 s dial, 3 s read and write).
	OpTimeout time.Duration
	// TLSServerName, when set, is the name every node's certificate is
	// verified against, for a rediss:// URL whose servers hold
	// certificates that name something other than the addresses dialled
	// (one certificate for all nodes, say). Empty verifies each
	// connection against the host of the address it dialled: the URL's
	// host for one server, each sentinel and the primary or replica it
	// announces for Sentinel, each node for a Cluster. It is ignored
	// without TLS, as RootCAs is.
	TLSServerName string
}

// NewRedisClient returns a client of the Redis that raw names, in one of
// three forms, and the topology it names (TopologySingle,
// TopologySentinel or TopologyCluster):
//
//   - single server: redis://[:password@]host:port/db, rediss:// for TLS,
//     unix:///path (go-redis ParseURL; a *redis.Client);
//   - Sentinel: redis://[:password@]sentinel1:26379/db?master_name=mymaster&addr=sentinel2:26379
//     (every sentinel's address, the first in the host part; the password
//     is the data nodes' requirepass, the sentinels are asked without one;
//     a failover client that follows the primary through failovers);
//   - Cluster: redis://[:password@]node1:7000?addr=node2:7000&addr=node3:7000
//     (seed nodes, the first in the host part; a cluster client).
//
// With rediss:// every connection verifies the certificate of the address
// it dialled (or o.TLSServerName), against o.RootCAs. A certificate that
// does not verify fails the first command with an error wrapping a
// *TLSHandshakeError, which names the address dialled and wraps the
// crypto/x509 error.
//
// The client has ContextTimeoutEnabled set (see NewMarkerStore). asynq
// takes it (asynq.NewServerFromRedisClient, NewClientFromRedisClient,
// NewInspectorFromRedisClient), as do NewMarkerStore and NewEnqueuer (and
// the daemon's listers and marker writes). The caller closes it.
//
// A password given as a query parameter (password=, sentinel_password=) is
// refused, since query strings are printed in full; put it in the URL's
// user information, which errors redact. Errors wrap ErrBadRedisURL and
// name the URL without its password. Nothing is dialled here.
func NewRedisClient(raw string, o RedisClientOptions) (redis.UniversalClient, string, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, "", fmt.Errorf("redis URL %s: %w", redact.URL(raw), ErrBadRedisURL)
	}
	q := u.Query()
	for _, k := range []string{"password", "sentinel_password"} {
		if q.Has(k) {
			return nil, "", fmt.Errorf("redis URL %s: a password as the query parameter %s is printed in full in logs; put it in the user information (redis://:PASSWORD@host): %w",
				redact.URL(raw), k, ErrBadRedisURL)
		}
	}
	redact := func(err error) error {
		msg := err.Error()
		if pw, ok := u.User.Password(); ok && pw != "" {
			msg = strings.ReplaceAll(msg, pw, "xxxxx")
		}
		return fmt.Errorf("redis URL %s: %s: %w", redact.URL(raw), msg, ErrBadRedisURL)
	}
	var uo *redis.UniversalOptions
	topology := TopologySingle
	switch {
	case q.Has("master_name"):
		fo, err := redis.ParseFailoverURL(raw)
		if err != nil {
			return nil, "", redact(err)
		}
		topology = TopologySentinel
		uo = &redis.UniversalOptions{Addrs: fo.SentinelAddrs, MasterName: fo.MasterName, DB: fo.DB,
			Username: fo.SentinelUsername, Password: fo.SentinelPassword, TLSConfig: fo.TLSConfig}
	case q.Has("addr"):
		co, err := redis.ParseClusterURL(raw)
		if err != nil {
			return nil, "", redact(err)
		}
		topology = TopologyCluster
		uo = &redis.UniversalOptions{Addrs: co.Addrs, Username: co.Username, Password: co.Password,
			TLSConfig: co.TLSConfig, IsClusterMode: true}
	default:
		opts, err := redis.ParseURL(raw)
		if err != nil {
			return nil, "", redact(err)
		}
		if opts.TLSConfig != nil {
			if o.RootCAs != nil {
				opts.TLSConfig.RootCAs = o.RootCAs
			}
			opts.Dialer = tlsDialer(opts.TLSConfig, o.TLSServerName)
		}
		if o.OpTimeout > 0 {
			opts.DialTimeout, opts.ReadTimeout, opts.WriteTimeout = o.OpTimeout, o.OpTimeout, o.OpTimeout
		}
		opts.ContextTimeoutEnabled = true
		return redis.NewClient(opts), topology, nil
	}
	if uo.TLSConfig != nil {
		if o.RootCAs != nil {
			uo.TLSConfig.RootCAs = o.RootCAs
		}
		// TLSConfig stays set: go-redis reads it as "this is TLS" (its
		// maintenance notifications ask for TLS endpoints); the Dialer is
		// what opens the connections.
		uo.Dialer = tlsDialer(uo.TLSConfig, o.TLSServerName)
	}
	if o.OpTimeout > 0 {
		uo.DialTimeout, uo.ReadTimeout, uo.WriteTimeout = o.OpTimeout, o.OpTimeout, o.OpTimeout
	}
	uo.ContextTimeoutEnabled = true
	return redis.NewUniversalClient(uo), topology, nil
}
