package queue

import (
	"errors"
	"strings"
	"testing"
)

// The three forms of a Redis URL give the three topologies; a password in
// a query parameter is refused without being printed.
func TestNewRedisClientTopologies(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct{ url, want string }{
		{"redis://:pw@127.0.0.1:6379/2", TopologySingle},
		{"unix:///run/redis.sock", TopologySingle},
		{"redis://127.0.0.1:26379/0?master_name=mymaster&addr=127.0.0.1:26380", TopologySentinel},
		{"redis://127.0.0.1:7000?addr=127.0.0.1:7001&addr=127.0.0.1:7002", TopologyCluster},
	} {
		rdb, topology, err := NewRedisClient(tt.url, RedisClientOptions{})
		if err != nil {
			t.Fatalf("%s: %v", tt.url, err)
		}
		_ = rdb.Close()
		if topology != tt.want {
			t.Errorf("%s: topology %s, want %s", tt.url, topology, tt.want)
		}
	}
	_, _, err := NewRedisClient("redis://127.0.0.1:7000?addr=127.0.0.1:7001&password=hunter2", RedisClientOptions{})
	if !errors.Is(err, ErrBadRedisURL) || strings.Contains(err.Error(), "hunter2") {
		t.Fatalf("err = %v, want ErrBadRedisURL without the password", err)
	}
}
