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
