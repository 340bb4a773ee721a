package config

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/redis/go-redis/v9"

	"github.com/jobreaper/jobreaper/jobs"
)

// FieldError is one problem with one setting. Load and Validate return
// every problem they find joined with errors.Join; each is a *FieldError.
type FieldError struct {
	// Key is the setting's YAML key, e.g. "stall_timeout"; for a cascade,
	// cascades["<type>"] followed by .on_failed or .on_completed.
	Key string
	// Msg is the whole sentence: the key, the value and the rule.
	Msg string
}

// Error returns Msg.
func (e *FieldError) Error() string { return e.Msg }

// schemaPattern is the rule jobs.Connect applies (jobs.ErrBadSchema), so
// that a bad schema is reported with every other problem before anything
// connects.
var schemaPattern = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,62}$`)

// Validate reports every problem of c, joined with errors.Join, each a
// *FieldError whose sentence names the setting by its YAML key, its value
// and the rule; nil when c is usable. It never changes c and fills no
// default: a zero field is reported, so call WithDefaults first when
// building a Config in code (Load already starts from the defaults).
//
// database_url is required, since every command reads or writes the jobs
// table. No URL's password appears in any message: URLs are shown through
// jobs.RedactURL.
func (c Config) Validate() error {
	var v validator
	v.databaseURL(c.DatabaseURL)
	v.redisURL(c.RedisURL)
	if !schemaPattern.MatchString(c.Schema) {
		v.addf("schema", "schema %q is not a plain PostgreSQL identifier: use letters, digits and underscore, at most 63 characters, not starting with a digit", c.Schema)
	}
	v.queues(c.Queues)
	v.positive("interval", c.Interval)
	v.positive("stall_timeout", c.StallTimeout)
	v.positive("heartbeat_interval", c.HeartbeatInterval)
	v.positive("hard_timeout_default", c.HardTimeoutDefault)
	v.positive("op_timeout", c.OpTimeout)
	if c.StartJitter < 0 {
		v.addf("start_jitter", "start_jitter %s is negative: use 0s to disable the delay or a positive duration such as 1s", c.StartJitter)
	}
	if c.PageSize < PageSizeMin {
		v.addf("page_size", "page_size %d is below the minimum %d: asynq re-checks every expired lease on each page, so small pages multiply that cost", c.PageSize, PageSizeMin)
	}
	if c.Interval > 0 && c.HeartbeatInterval > 0 && c.StallTimeout > 0 && c.StallTimeout < c.MinStallTimeout() {
		v.addf("stall_timeout", "stall_timeout %s is below 2 x heartbeat_interval (%s) + interval (%s) = %s: a live worker would be reaped between two heartbeats",
			c.StallTimeout, c.HeartbeatInterval, c.Interval, c.MinStallTimeout())
	}
	if c.StallTimeout > 0 && c.HardTimeoutDefault > 0 && c.HardTimeoutDefault <= c.StallTimeout {
		v.addf("hard_timeout_default", "hard_timeout_default %s is not longer than stall_timeout %s: asynq would cancel and retry a stalled task before the reaper could reap it",
			c.HardTimeoutDefault, c.StallTimeout)
	}
	v.metricsAddr(c.MetricsAddr)
	if !slices.Contains([]string{"debug", "info", "warn", "error"}, c.LogLevel) {
		v.addf("log_level", "log_level %q is not a level: use debug, info, warn or error", c.LogLevel)
	}
	if c.LogFormat != "text" && c.LogFormat != "json" {
		v.addf("log_format", "log_format %q is not a format: use text or json", c.LogFormat)
	}
	v.cascades(c.Cascades)
	return errors.Join(v.errs...)
}

type validator struct{ errs []error }

func (v *validator) addf(key, format string, args ...any) {
	v.errs = append(v.errs, &FieldError{Key: key, Msg: fmt.Sprintf(format, args...)})
}

func (v *validator) positive(key string, d time.Duration) {
	if d <= 0 {
		v.addf(key, "%s %s must be positive (Go duration such as 90s or 5m)", key, d)
	}
}

func (v *validator) databaseURL(raw string) {
	if raw == "" {
		v.addf("database_url", "database_url is required: set --database-url or JOBREAPER_DATABASE_URL to a PostgreSQL URL such as postgres://user:password@host:5432/db")
		return
	}
	// pgconn's errors can quote the URL, password included: never pass
	// them on.
	if _, err := pgconn.ParseConfig(raw); err != nil {
		v.addf("database_url", "database_url %s is not a valid PostgreSQL connection URL: use postgres://user:password@host:5432/db", jobs.RedactURL(raw))
	}
}

func (v *validator) redisURL(raw string) {
	if raw == "" {
		v.addf("redis_url", "redis_url is required: use redis://[:password@]host:port/db")
		return
	}
	u, err := url.Parse(raw)
	if err != nil {
		// url.Parse's error quotes the whole URL, password included.
		v.addf("redis_url", "redis_url %s is not a valid URL: use redis://[:password@]host:port/db", jobs.RedactURL(raw))
		return
	}
	if _, err := redis.ParseURL(raw); err != nil {
		reason := err.Error()
		if pw, ok := u.User.Password(); ok && pw != "" {
			reason = strings.ReplaceAll(reason, pw, "xxxxx")
		}
		v.addf("redis_url", "redis_url %s is not a valid Redis URL (%s): use redis://[:password@]host:port/db, rediss:// for TLS or unix:///path",
			jobs.RedactURL(raw), reason)
	}
}

func (v *validator) queues(queues []string) {
	seen := map[string]bool{}
	for i, q := range queues {
		switch {
		case strings.TrimSpace(q) == "":
			v.addf("queues", "queues item %d is empty: name a queue, or leave queues unset to scan every queue", i+1)
		case strings.TrimSpace(q) != q:
			v.addf("queues", "queues item %d %q has surrounding spaces: asynq queue names are matched exactly", i+1, q)
		case seen[q]:
			v.addf("queues", "queues item %d %q is listed twice", i+1, q)
		}
		seen[q] = true
	}
}

func (v *validator) metricsAddr(addr string) {
	if addr == MetricsAddrOff {
		return
	}
	_, port, err := net.SplitHostPort(addr)
	if err == nil {
		_, err = strconv.ParseUint(port, 10, 16)
	}
	if err != nil {
		v.addf("metrics_addr", "metrics_addr %q is not host:port (such as 127.0.0.1:9468 or :9468) nor %q", addr, MetricsAddrOff)
	}
}

// cascades adds every problem jobs.Cascades.Validate finds (empty type
// names and statements, named arguments other than @job_id, @parent_id,
// @tenant_id and @type), each already naming the type, hook and statement.
func (v *validator) cascades(c jobs.Cascades) {
	err := c.Validate()
	if err == nil {
		return
	}
	errs := []error{err}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		errs = j.Unwrap()
	}
	for _, e := range errs {
		v.addf(keyCascades, "cascades: %v", e)
	}
}
