package config

import (
	"fmt"
	"reflect"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/jobreaper/jobreaper/internal/editdistance"
)

// EnvPrefix starts the name of every environment variable jobreaper reads.
const EnvPrefix = "JOBREAPER_"

// EnvConfigFile names the YAML file to load when --config is not given.
const EnvConfigFile = EnvPrefix + "CONFIG"

// FlagConfigFile is the flag that names the YAML file to load.
const FlagConfigFile = "config"

// keyCascades is the one setting that only the file can hold.
const keyCascades = "cascades"

// setting describes one Config field that the file, the environment and a
// flag can all set.
type setting struct {
	key   string // YAML key and koanf path, e.g. "stall_timeout"
	usage string // flag help; the default is appended by pflag
	// secret settings never show their value in an error except through
	// redact.URL.
	secret bool
}

// settings lists, in help order, every Config field except Cascades.
var settings = []setting{
	{key: "database_url", secret: true, usage: "PostgreSQL URL, e.g. postgres://user:password@host:5432/db (required; passwords never appear in logs or errors)"},
	{key: "redis_url", secret: true, usage: "Redis URL of the asynq queues, with its scheme: redis://[:password@]host:port/db, rediss:// for TLS; Sentinel: ?master_name=NAME&addr=SENTINEL2; Cluster: ?addr=NODE2&addr=NODE3"},
	{key: "redis_ca_file", usage: "PEM file of the CAs that sign the Redis server's certificate, for rediss:// (default: the system's roots)"},
	{key: "redis_tls_server_name", usage: "for rediss://, the name every Redis node's certificate is verified against, where certificates name something other than the addresses dialled (default: each connection's own host)"},
	{key: "schema", usage: "PostgreSQL schema of jobreaper's tables"},
	{key: "queues", usage: "asynq queues to scan, comma-separated; empty scans every queue asynq knows, rediscovered at each pass"},
	{key: "interval", usage: "time between two daemon passes (Go duration: 90s, 5m, 1h)"},
	{key: "stall_timeout", usage: "idle time after which a job past its max_runtime is reaped, for types without their own; at least 2 x heartbeat-interval + interval (Go duration)"},
	{key: "heartbeat_interval", usage: "longest gap between two heartbeats of a live worker: the interval the workers give jobs.NewHeartbeater, which it must equal (Go duration)"},
	{key: "page_size", usage: "active tasks fetched per Redis page, at least 1000 (tasks)"},
	{key: "lister", usage: `how active tasks are listed: "ids" reads asynq's active lists directly (task IDs only), "inspector" goes through asynq's Inspector`},
	{key: "metrics_addr", usage: `host:port serving /metrics and /healthz; "off" starts no server`},
	{key: "status_addr", usage: `host:port of the read-only status page (/ and /jobs/<id>); "off" starts no server. Keep it on loopback unless you mean to expose it: it shows job IDs, types and workers`},
	{key: "log_level", usage: "log level: debug, info, warn or error (logs go to stderr)"},
	{key: "log_format", usage: "log format: text or json"},
	{key: "start_jitter", usage: "upper bound of a random delay before the first pass; 0s disables it (Go duration)"},
	{key: "op_timeout", usage: "timeout of each single PostgreSQL or Redis operation (Go duration)"},
	{key: "stale_queued_after", usage: "how long a job may stay QUEUED before it is reported as stale when asynq will never run its task (Go duration)"},
	{key: "marker_check_window", usage: "time within which the daemon re-asserts the marker of every job reaped in the last 7 days, a slice per pass; at least interval (Go duration)"},
	{key: "max_lost_per_pass", usage: "most jobs one cycle over the lost-task candidates may reap as lost_task; a cycle that would reap more reaps none (Redis lost its data?); 0 means no limit (jobs)"},
	{key: "max_stalled_per_pass", usage: "most jobs one pass may reap as stalled; a pass that would reap more reaps none and holds their queues for stall_storm_hold (workers cut off from PostgreSQL?); 0 means no limit (jobs)"},
	{key: "max_stalled_fraction", usage: "largest share of the active tasks a pass judged it may reap as stalled, once they are 10 or more; a pass that would reap more holds them likewise; 0 means no limit (0 to 1)"},
	{key: "stall_storm_hold", usage: "how long a stall-storm hold lasts; 0s means the longest stall timeout among the held jobs' types (Go duration)"},
	{key: "stale_queued_lookups_per_pass", usage: "most QUEUED rows one daemon pass looks up in asynq, at least 1 (rows)"},
	{key: "strict_queues", usage: "run --once refuses to run (exit 2) when a queue of --queues is not known to asynq in that Redis, instead of warning and scanning it as empty"},
	{key: "outage_grace", usage: "idle time never counts across a PostgreSQL outage: after a restart, a failover or lost connections, no job idle since before it is reaped for one stall timeout; false turns it off"},
}

// flagName returns the flag of a YAML key: stall_timeout -> stall-timeout.
func flagName(key string) string { return strings.ReplaceAll(key, "_", "-") }

// envName returns the environment variable of a YAML key:
// stall_timeout -> JOBREAPER_STALL_TIMEOUT.
func envName(key string) string { return EnvPrefix + strings.ToUpper(key) }

// Names returns how the operator writes the setting key in each source:
// its flag (with dashes) and environment variable. It returns ok=false for
// a key that is not a setting (cascades has neither).
func Names(key string) (flag, env string, ok bool) {
	for _, s := range settings {
		if s.key == key {
			return "--" + flagName(key), envName(key), true
		}
	}
	return "", "", false
}

// RegisterFlags defines on fs one flag per setting, named after its YAML key
// with dashes, showing the default in its help, plus --config. With keys,
// the flags of the other settings are hidden: a command's --help lists
// only what it uses, while a command line written for the daemon still
// parses (its other settings are read and not checked, like the file's).
// Load reads only the flags the command line set, so a flag's default
// never overrides the file or the environment.
func RegisterFlags(fs *pflag.FlagSet, keys ...string) {
	def := reflect.ValueOf(Config{}.WithDefaults())
	fs.String(FlagConfigFile, "", "YAML config file (also "+EnvConfigFile+"); see deploy/jobreaper.example.yaml")
	for _, s := range settings {
		name := flagName(s.key)
		if len(keys) > 0 && !keyIn(s.key, keys) {
			defer func() { _ = fs.MarkHidden(name) }()
		}
		v := fieldOf(def, s.key)
		switch v.Interface().(type) {
		case time.Duration:
			fs.Duration(name, time.Duration(v.Int()), s.usage)
		case bool:
			fs.Bool(name, v.Bool(), s.usage)
		case int:
			fs.Int(name, int(v.Int()), s.usage)
		case float64:
			fs.Float64(name, v.Float(), s.usage)
		case []string:
			fs.StringSlice(name, nil, s.usage)
		case string:
			fs.String(name, v.String(), s.usage)
		case *bool:
			fs.Bool(name, v.Elem().Bool(), s.usage)
		default:
			panic(fmt.Sprintf("config: no flag kind for %s (%s)", s.key, v.Type()))
		}
	}
}

// fieldOf returns the field of the Config struct v whose koanf tag is key.
// It panics on an unknown key: the settings table and the struct disagree.
func fieldOf(v reflect.Value, key string) reflect.Value {
	t := v.Type()
	for i := range t.NumField() {
		if t.Field(i).Tag.Get("koanf") == key {
			return v.Field(i)
		}
	}
	panic("config: no Config field tagged " + key)
}

// knownKeys returns every YAML key, settings and cascades.
func knownKeys() []string {
	keys := make([]string, 0, len(settings)+1)
	for _, s := range settings {
		keys = append(keys, s.key)
	}
	return append(keys, keyCascades)
}

// Closest returns the name among known nearest to name by edit distance
// (EditDistance) when it is close enough to be a typo (fewer than half its
// length plus 2 edits), else "": the did-you-mean of an unknown config key
// or of a queue asynq does not know. Of two as near, the first in known
// wins.
func Closest(name string, known []string) string {
	best, bestD := "", len(name)/2+2
	for _, k := range known {
		if d := EditDistance(name, k); d < bestD {
			best, bestD = k, d
		}
	}
	return best
}

// EditDistance is the Levenshtein distance between a and b (in bytes: the
// names it compares are mostly ASCII): the fewest single-byte insertions,
// deletions and substitutions that turn a into b. It picks the closest
// known key, flag or queue for a "did you mean" hint.
func EditDistance(a, b string) int { return editdistance.Between(a, b) }
