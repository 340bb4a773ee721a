package asynqstate

import (
	"errors"
	"strings"
	"testing"

	"github.com/jobreaper/jobreaper/queue"
)

// RedisID names topology, address or master name, and database, and
// nothing else: two URLs of the same Redis get the same ID whatever their
// password, TLS or options, two databases get two.
func TestRedisID(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct{ url, want string }{
		{"redis://127.0.0.1:6379/0", "single 127.0.0.1:6379/0"},
		{"redis://127.0.0.1", "single 127.0.0.1:6379/0"},
		{"redis://:s3cret@Redis.Example.com:6380/9", "single redis.example.com:6380/9"},
		{"rediss://app:s3cret@redis.example.com:6380/9?dial_timeout=3s", "single redis.example.com:6380/9"},
		{"redis://[::1]:6379/8", "single [::1]:6379/8"},
		{"unix:///run/redis.sock?db=2", "single unix:/run/redis.sock/2"},
		{"redis://:s3cret@s1:26379/4?master_name=mymaster&addr=s2:26379", "sentinel mymaster/4"},
		{"rediss://s2:26379/4?master_name=mymaster", "sentinel mymaster/4"},
		{"redis://:s3cret@n2:7000?addr=n1:7000&addr=N3:7000&addr=n1:7000", "cluster n1:7000,n2:7000,n3:7000/0"},
		{"redis://n3:7000?addr=n2:7000&addr=n1:7000", "cluster n1:7000,n2:7000,n3:7000/0"},
	} {
		got, err := RedisID(tt.url)
		if err != nil || got != tt.want {
			t.Errorf("RedisID(%s) = %q, %v; want %q", tt.url, got, err, tt.want)
		}
	}
}

func TestRedisIDRefusesABadURLWithoutItsPassword(t *testing.T) {
	t.Parallel()
	for _, raw := range []string{
		"redis://:s3cret@host:6379/notadb",
		"http://:s3cret@host:6379/0",
		"redis://:s3cret@host:bad port/0",
		"redis://:s3cret@s1:26379/x?master_name=m",
	} {
		id, err := RedisID(raw)
		if !errors.Is(err, queue.ErrBadRedisURL) || id != "" {
			t.Errorf("RedisID(%s) = %q, %v; want queue.ErrBadRedisURL", raw, id, err)
			continue
		}
		if strings.Contains(err.Error(), "s3cret") {
			t.Errorf("RedisID's error shows the password: %v", err)
		}
	}
}
