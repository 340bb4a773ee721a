package config

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/redis/go-redis/v9"

	"github.com/jobreaper/jobreaper/internal/idcheck"
	"github.com/jobreaper/jobreaper/internal/redact"
	"github.com/jobreaper/jobreaper/jobs"
)

// FieldError is one problem with one setting. Load and Validate return
// every problem they find joined with errors.Join; each is a *FieldError.
type FieldError struct {
	// Key is the setting's YAML key, e.g. "stall_timeout"; for a cascade,
	// cascades["<type>"] followed by .on_failed or .on_completed; for a key
	// of the file that is not a setting, that key.
	Key string
	// Msg is the whole sentence: the key, the value and the rule.
	Msg string
	// Related are the other settings the rule compares Key with, e.g.
	// heartbeat_interval and interval for stall_timeout's floor.
	Related []string
	// Source says where the values of Key and Related came from, e.g.
	// "from flag --stall-timeout"; "" when unknown or when all are
	// defaults. Load sets it on its own problems; Origins.Annotate sets it
	// on Validate's.
	Source string

	// unknownKey marks a key of the file that is not a setting.
	unknownKey bool
}

// Error returns Msg followed by Source in parentheses when it is known.
func (e *FieldError) Error() string {
	if e.Source == "" {
		return e.Msg
	}
	return e.Msg + " (" + e.Source + ")"
}

// Validate reports every problem of c, joined with errors.Join, each a
// *FieldError whose sentence names the setting by its YAML key, its value
// and the rule; nil when c is usable. It never changes c and fills no
// default: a zero field is reported, so call WithDefaults first when
// building a Config in code (Load already starts from the defaults).
//
// database_url is required, since every command reads or writes the jobs
// table. No URL's password appears in any message: URLs are shown through
// redact.URL.
func (c Config) Validate() error {
	var v validator
	v.databaseURL(c.DatabaseURL)
	v.redisURL(c.RedisURL)
	v.redisCAFile(c.RedisCAFile, c.RedisURL)
	v.redisTLSServerName(c.RedisTLSServerName, c.RedisURL)
	// The rule jobs.Connect applies, reported here with every other
	// problem before anything connects.
	if !idcheck.ValidSchema(c.Schema) {
		v.addf("schema", "schema %q is not a plain PostgreSQL identifier: use letters, digits and underscore, at most 63 characters, not starting with a digit", c.Schema)
	} else if idcheck.SystemSchema(c.Schema) {
		v.addf("schema", "schema %q is PostgreSQL's own (information_schema and pg_* are reserved): choose a schema of your own, such as jobreaper", c.Schema)
	}
	v.queues(c.Queues)
	v.positive("interval", c.Interval)
	v.positive("stall_timeout", c.StallTimeout)
	v.positive("heartbeat_interval", c.HeartbeatInterval)
	v.positive("op_timeout", c.OpTimeout)
	v.positive("stale_queued_after", c.StaleQueuedAfter)
	if c.MaxLostPerPass < 0 {
		v.addf("max_lost_per_pass", "max_lost_per_pass %d is negative: use 0 for no limit or a positive number of jobs", c.MaxLostPerPass)
	}
	if c.MaxStalledPerPass < 0 {
		v.addf("max_stalled_per_pass", "max_stalled_per_pass %d is negative: use 0 for no limit or a positive number of jobs", c.MaxStalledPerPass)
	}
	if !(c.MaxStalledFraction >= 0 && c.MaxStalledFraction <= 1) { // NaN too
		v.addf("max_stalled_fraction", "max_stalled_fraction %g is not between 0 and 1: it is a share of the active tasks a pass judged (0.5 is half of them; 0 means no limit)", c.MaxStalledFraction)
	}
	if c.StallStormHold < 0 {
		v.addf("stall_storm_hold", "stall_storm_hold %s is negative: use 0s for the longest stall timeout among the held jobs' types, or a positive duration such as 15m", c.StallStormHold)
	}
	if c.Interval > 0 && c.MarkerCheckWindow < c.Interval {
		v.add(&FieldError{Key: "marker_check_window", Related: []string{"interval"},
			Msg: fmt.Sprintf("marker_check_window %s is below interval %s: the window is covered a slice per pass, so it needs at least one pass", c.MarkerCheckWindow, c.Interval)})
	}
	if c.StaleQueuedLookupsPerPass < 1 {
		v.addf("stale_queued_lookups_per_pass", "stale_queued_lookups_per_pass %d is below 1: the pass must look up at least one QUEUED row", c.StaleQueuedLookupsPerPass)
	}
	if c.StartJitter < 0 {
		v.addf("start_jitter", "start_jitter %s is negative: use 0s to disable the delay or a positive duration such as 1s", c.StartJitter)
	}
	if c.PageSize < PageSizeMin {
		v.addf("page_size", "page_size %d is below the minimum %d: asynq re-checks every expired lease on each page, so small pages multiply that cost", c.PageSize, PageSizeMin)
	}
	if c.Lister != ListerIDs && c.Lister != ListerInspector {
		v.addf("lister", "lister %q is not a lister: use %s or %s", c.Lister, ListerIDs, ListerInspector)
	}
	if floor, saturated := c.minStallTimeout(); c.Interval > 0 && c.HeartbeatInterval > 0 && c.StallTimeout > 0 && (saturated || c.StallTimeout < floor) {
		sum := "= " + floor.String()
		if saturated {
			sum = "which is longer than the longest duration (about 292 years)"
		}
		v.add(&FieldError{
			Key:     "stall_timeout",
			Related: []string{"heartbeat_interval", "interval"},
			Msg: fmt.Sprintf("stall_timeout %s is below 2 x heartbeat_interval (%s) + interval (%s) %s: a live worker would be reaped between two heartbeats",
				c.StallTimeout, c.HeartbeatInterval, c.Interval, sum),
		})
	}
	v.metricsAddr(c.MetricsAddr)
	v.statusAddr(c.StatusAddr)
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
	v.add(&FieldError{Key: key, Msg: fmt.Sprintf(format, args...)})
}

func (v *validator) add(fe *FieldError) { v.errs = append(v.errs, fe) }

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
		switch {
		case !noScheme(raw):
			v.addf("database_url", "database_url %s is not a valid PostgreSQL connection URL: use postgres://user:password@host:5432/db", redact.URL(raw))
		case strings.Contains(raw, "="):
			// A keyword=value string: redact.URL cannot redact it.
			v.addf("database_url", "database_url (a keyword=value string, not shown: it may hold a password) is not a valid PostgreSQL connection string: use postgres://user:password@host:5432/db")
		default:
			v.addf("database_url", "database_url %s has no scheme: write it as a URL such as %s",
				schemeless(raw), suggestURL(raw, "postgres://user:password@", "/db", "postgres://user:password@127.0.0.1:5432/db"))
		}
	}
}

// noScheme reports whether raw lacks the "scheme://" a URL starts with.
func noScheme(raw string) bool { return !strings.Contains(raw, "://") }

// schemeless shows a value that has no scheme, which redact.URL cannot
// parse: a plain host:port as it is; with an "@", what follows it (what
// precedes may be a password); anything else not at all, since it may be
// a password in another form.
func schemeless(raw string) string {
	if plainHostPort(raw) {
		return strconv.Quote(raw)
	}
	if i := strings.LastIndex(raw, "@"); i >= 0 && !strings.ContainsAny(raw[i+1:], "= \t") {
		return strconv.Quote("xxxxx@" + raw[i+1:])
	}
	return "(not shown: it may hold a password)"
}

// plainHostPort reports whether raw is host:port with a numeric port and
// nothing else, so that it cannot hold a password.
func plainHostPort(raw string) bool {
	host, port, err := net.SplitHostPort(raw)
	if err != nil || host == "" || strings.ContainsAny(raw, "@/?#= \t") {
		return false
	}
	_, err = strconv.ParseUint(port, 10, 16)
	return err == nil
}

// suggestURL returns raw between scheme and suffix when raw is a plain
// host:port, else fallback.
func suggestURL(raw, scheme, suffix, fallback string) string {
	if plainHostPort(raw) {
		return scheme + raw + suffix
	}
	return fallback
}

// redisCAFile checks that a CA file goes with a rediss:// URL; the file
// itself is read when the client is built, so that its error names it.
func (v *validator) redisCAFile(file, rawURL string) {
	if file != "" && !strings.HasPrefix(rawURL, "rediss://") {
		v.addf("redis_ca_file", "redis_ca_file %s is set but redis_url is not rediss://: the CA file only applies to TLS", file)
	}
}

// redisTLSServerName checks that a server name goes with a rediss:// URL
// and is a name alone: a host name or an IP address, without a scheme,
// port or path.
func (v *validator) redisTLSServerName(name, rawURL string) {
	switch {
	case name == "":
	case !strings.HasPrefix(rawURL, "rediss://"):
		v.addf("redis_tls_server_name", "redis_tls_server_name %q is set but redis_url is not rediss://: the name is what TLS verifies certificates against", name)
	case strings.ContainsAny(name, "/@ \t") || hasPort(name):
		v.addf("redis_tls_server_name", "redis_tls_server_name %q is not a host name or IP address: give the name the certificates list alone, without scheme, port or path (e.g. redis.internal)", name)
	}
}

// hasPort reports whether s is host:port (an IPv6 address alone is not).
func hasPort(s string) bool {
	_, _, err := net.SplitHostPort(s)
	return err == nil
}

func (v *validator) redisURL(raw string) {
	if raw == "" {
		v.addf("redis_url", "redis_url is required: use redis://[:password@]host:port/db")
		return
	}
	if noScheme(raw) {
		v.addf("redis_url", "redis_url %s has no scheme: write it as a URL such as %s (rediss:// for TLS, unix:///path for a socket)",
			schemeless(raw), suggestURL(raw, "redis://", "/0", "redis://127.0.0.1:6379/0"))
		return
	}
	u, err := url.Parse(raw)
	if err != nil {
		// url.Parse's error quotes the whole URL, password included.
		v.addf("redis_url", "redis_url %s is not a valid URL: use redis://[:password@]host:port/db", redact.URL(raw))
		return
	}
	// The three forms of queue.NewRedisClient: Sentinel (master_name),
	// Cluster (more nodes as addr=), else one server.
	var perr error
	switch q := u.Query(); {
	case q.Has("password"), q.Has("sentinel_password"):
		v.addf("redis_url", "redis_url %s carries a password as a query parameter, which would be printed in full: put it in the user information (redis://:PASSWORD@host)", redact.URL(raw))
		return
	case q.Has("master_name"):
		_, perr = redis.ParseFailoverURL(raw)
	case q.Has("addr"):
		_, perr = redis.ParseClusterURL(raw)
	default:
		_, perr = redis.ParseURL(raw)
	}
	if err := perr; err != nil {
		reason := err.Error()
		if pw, ok := u.User.Password(); ok && pw != "" {
			reason = strings.ReplaceAll(reason, pw, "xxxxx")
		}
		v.addf("redis_url", "redis_url %s is not a valid Redis URL (%s): use redis://[:password@]host:port/db, rediss:// for TLS or unix:///path",
			redact.URL(raw), reason)
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
		default:
			if err := idcheck.CheckName("queue name", q); err != nil {
				v.addf("queues", "queues item %d: %s: a jobs row cannot name such a queue, nor a metric label hold it",
					i+1, strings.TrimSuffix(err.Error(), ": "+idcheck.ErrBadName.Error()))
			}
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

func (v *validator) statusAddr(addr string) {
	if addr == StatusAddrOff {
		return
	}
	_, port, err := net.SplitHostPort(addr)
	if err == nil {
		_, err = strconv.ParseUint(port, 10, 16)
	}
	if err != nil {
		v.addf("status_addr", "status_addr %q is not host:port (such as 127.0.0.1:9469) nor %q", addr, StatusAddrOff)
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
