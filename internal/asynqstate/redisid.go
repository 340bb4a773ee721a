package asynqstate

import (
	"fmt"
	"net"
	"net/url"
	"slices"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/jobreaper/jobreaper/internal/redact"
	"github.com/jobreaper/jobreaper/queue"
)

// RedisID names the Redis a URL of NewRedisClient's three forms reads, so
// that two daemons can tell whether they read the same one (the settings
// drift check): the topology, then
//
//   - single server: host:port/db ("single 10.0.0.5:6379/9"), the port
//     defaulted to 6379 and the database to 0; a Unix socket as
//     unix:path/db;
//   - Sentinel: the master name and the database ("sentinel mymaster/9"):
//     replicas may list the sentinels differently and still reach the
//     same primary;
//   - Cluster: the seed nodes, sorted and without duplicates, and database
//     0, the only one a cluster has ("cluster 10.0.0.1:7000,10.0.0.2:7000/0").
//
// Host names are lower-cased. Nothing else of the URL is kept: no user
// name or password, no TLS (rediss:// reads the same Redis as redis://),
// no option. Errors wrap queue.ErrBadRedisURL and name the URL without its
// password; nothing is dialled.
func RedisID(raw string) (string, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return "", fmt.Errorf("redis URL %s: %w", redact.URL(raw), queue.ErrBadRedisURL)
	}
	fail := func(err error) (string, error) {
		msg := err.Error()
		if pw, ok := u.User.Password(); ok && pw != "" {
			msg = strings.ReplaceAll(msg, pw, "xxxxx")
		}
		return "", fmt.Errorf("redis URL %s: %s: %w", redact.URL(raw), msg, queue.ErrBadRedisURL)
	}
	q := u.Query()
	switch {
	case q.Has("master_name"):
		fo, err := redis.ParseFailoverURL(raw)
		if err != nil {
			return fail(err)
		}
		return fmt.Sprintf("%s %s/%d", queue.TopologySentinel, fo.MasterName, fo.DB), nil
	case q.Has("addr"):
		co, err := redis.ParseClusterURL(raw)
		if err != nil {
			return fail(err)
		}
		seeds := make([]string, len(co.Addrs))
		for i, a := range co.Addrs {
			seeds[i] = lowerHost(a)
		}
		slices.Sort(seeds)
		return fmt.Sprintf("%s %s/0", queue.TopologyCluster, strings.Join(slices.Compact(seeds), ",")), nil
	}
	o, err := redis.ParseURL(raw)
	if err != nil {
		return fail(err)
	}
	if o.Network == "unix" {
		return fmt.Sprintf("%s unix:%s/%d", queue.TopologySingle, o.Addr, o.DB), nil
	}
	return fmt.Sprintf("%s %s/%d", queue.TopologySingle, lowerHost(o.Addr), o.DB), nil
}

// lowerHost lower-cases the host of a host:port address (DNS names are
// case-insensitive).
func lowerHost(addr string) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return strings.ToLower(addr)
	}
	return net.JoinHostPort(strings.ToLower(host), port)
}
