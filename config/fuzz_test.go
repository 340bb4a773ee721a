package config

import (
	"errors"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// FuzzLoadConfigFile loads any bytes as the YAML config file, then
// validates what loaded. Every outcome is a clear error or a usable
// configuration, never a panic: each problem is one line (the CLI prints
// it as one line on stderr) and, when it is about a setting, names it; a
// configuration Validate accepts keeps its rules in exact arithmetic (the
// stall timeout at least 2 x heartbeat_interval + interval, positive
// durations), whatever durations near time.Duration's 292-year limit
// would make of Go's own sums.
func FuzzLoadConfigFile(f *testing.F) {
	for _, s := range []string{
		"database_url: postgres://u:pw@db:5432/app\n",
		"database_url: postgres://u@db/app\nstall_timeout: 20m\nheartbeat_interval: 5m\ninterval: 1m\n",
		"database_url: postgres://u@db/app\nheartbeat_interval: 1562500h\ninterval: 1m\nstall_timeout: 12m\n",
		"database_url: postgres://u@db/app\ninterval: 2562047h\nheartbeat_interval: 1ns\nstall_timeout: 1h\nmarker_check_window: 2562047h\n",
		"queues: [a, b\n",
		"- a\n- b\n",
		"interval:\n",
		"page_size: 99999999999999999999999\n",
		"page_size: -5\nmax_lost_per_pass: -1\nstart_jitter: -1s\n",
		"cascades:\n  report.export:\n    on_failed: [\"UPDATE p SET n = n + 1 WHERE id = @parent_id\"]\n",
		"cascades: {x: {on_failed: 7}}\n",
		"database_url: \"postgres://u:s3cret@db:notaport/app\"\nredis_url: \"redis://:s3cret@cache:6379/x\"\n",
		"stal_timeout: 5m\n",
		"a: &a [*a]\n",
		"\xff\xfe",
		"",
	} {
		f.Add([]byte(s))
	}
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, data []byte) {
		path := filepath.Join(dir, "jobreaper.yaml")
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		cfg, origins, err := LoadWithOrigins(Sources{File: path})
		if err != nil {
			requireClearProblems(t, err)
			return
		}
		if cfg.DatabaseURL == "" {
			cfg.DatabaseURL = "postgres://u@db:5432/app"
		}
		if err := origins.Annotate(cfg.Validate()); err != nil {
			requireClearProblems(t, err)
			return
		}
		requireSaneRules(t, cfg)
	})
}

// requireClearProblems fails unless every problem joined in err is one
// non-empty line, and every *FieldError names its key.
func requireClearProblems(t *testing.T, err error) {
	t.Helper()
	var walk func(error)
	walk = func(e error) {
		if j, ok := e.(interface{ Unwrap() []error }); ok {
			for _, x := range j.Unwrap() {
				walk(x)
			}
			return
		}
		msg := e.Error()
		if strings.TrimSpace(msg) == "" || strings.ContainsAny(msg, "\n\r") {
			t.Fatalf("problem %q is not one line", msg)
		}
		var fe *FieldError
		if errors.As(e, &fe) && !fe.unknownKey && !strings.Contains(fe.Msg, fe.Key) {
			t.Fatalf("problem %q does not name its setting %q", fe.Msg, fe.Key)
		}
	}
	walk(err)
}

// requireSaneRules checks what Validate promises of an accepted
// configuration in exact (big) arithmetic.
func requireSaneRules(t *testing.T, c Config) {
	t.Helper()
	n := func(d time.Duration) *big.Int { return big.NewInt(int64(d)) }
	floor := new(big.Int).Add(new(big.Int).Mul(big.NewInt(2), n(c.HeartbeatInterval)), n(c.Interval))
	if n(c.StallTimeout).Cmp(floor) < 0 {
		t.Fatalf("Validate accepts stall_timeout %s below 2 x heartbeat_interval (%s) + interval (%s) = %s ns",
			c.StallTimeout, c.HeartbeatInterval, c.Interval, floor)
	}
	if c.MinStallTimeout() <= 0 || c.MinStallTimeout() > c.StallTimeout {
		t.Fatalf("Validate accepts a configuration whose MinStallTimeout is %s (stall_timeout %s)", c.MinStallTimeout(), c.StallTimeout)
	}
	for key, d := range map[string]time.Duration{"interval": c.Interval, "stall_timeout": c.StallTimeout,
		"heartbeat_interval": c.HeartbeatInterval, "op_timeout": c.OpTimeout, "stale_queued_after": c.StaleQueuedAfter} {
		if d <= 0 {
			t.Fatalf("Validate accepts %s %s", key, d)
		}
	}
	if c.PageSize < PageSizeMin || c.MaxLostPerPass < 0 || c.StartJitter < 0 || c.MarkerCheckWindow < c.Interval {
		t.Fatalf("Validate accepts %+v", c)
	}
}

// FuzzConfigNeverShowsAPassword puts a password into database_url and
// redis_url in every form an operator might (user information, a query
// parameter, a keyword=value string, no scheme at all), around any other
// text, and loads them from the environment and a file: no problem Load
// or Validate reports may hold the password.
func FuzzConfigNeverShowsAPassword(f *testing.F) {
	for _, s := range []struct {
		form       uint8
		user, rest string
	}{
		{0, "u", "db:5432/app"}, {0, "u", "db:notaport/app"}, {0, "", "cache:6379/x"}, {1, "", "db/app"},
		{1, "", "db/app?sslmode=sometimes&x=1"}, {2, "host=db", "port=x"}, {3, "u", "db:5432/app"},
		{4, "u", "db/app?sslmode=sometimes"}, {0, "u@x", "db host/app"}, {5, "", "cache:6379"},
	} {
		f.Add(s.form, s.user, "pw", s.rest)
	}
	f.Fuzz(func(t *testing.T, form uint8, user, pw, rest string) {
		// A password no other text can hold by chance.
		secret := "S3cr3tPw" + strings.Map(func(r rune) rune {
			if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' {
				return r
			}
			return -1
		}, pw)
		var dbURL, redisURL string
		switch form % 6 {
		case 0: // user information
			dbURL, redisURL = "postgres://"+user+":"+secret+"@"+rest, "redis://"+user+":"+secret+"@"+rest
		case 1: // query parameter
			dbURL, redisURL = "postgres://"+user+"@"+rest+"&password="+secret, "redis://"+rest+"?password="+secret
		case 2: // keyword=value
			dbURL, redisURL = user+" password="+secret+" "+rest, user+" password="+secret+" "+rest
		case 3: // no scheme
			dbURL, redisURL = user+":"+secret+"@"+rest, ":"+secret+"@"+rest
		case 4: // the TLS key's password
			dbURL, redisURL = "postgres://"+user+"@"+rest+"&sslpassword="+secret, "rediss://:"+secret+"@"+rest
		case 5: // Sentinel
			dbURL, redisURL = "postgresql://"+user+":"+secret+"@"+rest, "redis://:"+secret+"@"+rest+"?master_name=m&sentinel_password="+secret
		}
		var texts []string
		collect := func(err error) {
			if err != nil {
				texts = append(texts, err.Error())
			}
		}
		cfg, err := Load(Sources{Environ: []string{"JOBREAPER_DATABASE_URL=" + dbURL, "JOBREAPER_REDIS_URL=" + redisURL}})
		collect(err)
		collect(cfg.Validate())
		path := filepath.Join(t.TempDir(), "jobreaper.yaml")
		yaml := "database_url: " + quoteYAML(dbURL) + "\nredis_url: " + quoteYAML(redisURL) + "\n"
		if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
			t.Fatal(err)
		}
		cfg, origins, err := LoadWithOrigins(Sources{File: path})
		collect(err)
		collect(origins.Annotate(cfg.Validate()))
		for _, text := range texts {
			if strings.Contains(text, secret) {
				t.Fatalf("database_url %q / redis_url %q: a problem shows the password:\n%s", dbURL, redisURL, text)
			}
		}
	})
}

// quoteYAML writes s as a YAML double-quoted scalar.
func quoteYAML(s string) string {
	r := strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`, "\r", `\r`, "\t", `\t`)
	return `"` + r.Replace(s) + `"`
}
