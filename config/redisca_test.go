package config

import (
	"strings"
	"testing"
)

// A CA file applies to TLS only: with a redis:// URL it is refused,
// naming the setting; with rediss:// it is accepted.
func TestRedisCAFileNeedsRediss(t *testing.T) {
	t.Parallel()
	c := Config{DatabaseURL: "postgres://db/app", RedisURL: "redis://127.0.0.1:6379/0", RedisCAFile: "/etc/ca.pem"}.WithDefaults()
	err := c.Validate()
	if err == nil || !strings.Contains(err.Error(), "redis_ca_file /etc/ca.pem is set but redis_url is not rediss://") {
		t.Fatalf("Validate = %v, want the redis_ca_file rule", err)
	}
	c.RedisURL = "rediss://127.0.0.1:6380/0"
	if err := c.Validate(); err != nil {
		t.Fatalf("Validate with rediss:// = %v", err)
	}
}

// A TLS server name applies to TLS only and is a name alone: with a
// redis:// URL, or written as host:port or a URL, it is refused naming
// the setting and its value; a host name or an IP address with rediss://
// is accepted, and so is no name at all.
func TestRedisTLSServerNameNeedsRedissAndAName(t *testing.T) {
	t.Parallel()
	base := Config{DatabaseURL: "postgres://db/app", RedisURL: "rediss://127.0.0.1:6380/0"}.WithDefaults()
	for _, tc := range []struct{ url, name, want string }{
		{"redis://127.0.0.1:6379/0", "redis.internal", `redis_tls_server_name "redis.internal" is set but redis_url is not rediss://`},
		{"rediss://127.0.0.1:6380/0", "redis.internal:6380", `redis_tls_server_name "redis.internal:6380" is not a host name or IP address`},
		{"rediss://127.0.0.1:6380/0", "rediss://redis.internal", `redis_tls_server_name "rediss://redis.internal" is not a host name or IP address`},
		{"rediss://127.0.0.1:6380/0", "redis.internal", ""},
		{"rediss://127.0.0.1:6380/0", "10.0.0.7", ""},
		{"rediss://127.0.0.1:6380/0", "::1", ""},
		{"redis://127.0.0.1:6379/0", "", ""},
	} {
		c := base
		c.RedisURL, c.RedisTLSServerName = tc.url, tc.name
		err := c.Validate()
		if tc.want == "" {
			if err != nil {
				t.Errorf("Validate(%s, %q) = %v, want nil", tc.url, tc.name, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Validate(%s, %q) = %v, want %q", tc.url, tc.name, err, tc.want)
		}
	}
}
