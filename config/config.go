// Package config holds jobreaper's one Config struct: its defaults, its
// loading from a YAML file, the environment and command-line flags, and its
// validation with errors that name the setting, its value and the rule.
//
// Every setting has one name, its YAML key (stall_timeout); the flag is the
// key with dashes (--stall-timeout) and the environment variable the key in
// capitals behind JOBREAPER_ (JOBREAPER_STALL_TIMEOUT). Error messages use the
// YAML key and, through LoadWithOrigins and Origins.Annotate, say where a
// bad value came from. Precedence, lowest first: defaults, the YAML file,
// the environment, flags given on the command line.
package config

import (
	"cmp"
	"time"

	"github.com/jobreaper/jobreaper/internal/pgstore"
	"github.com/jobreaper/jobreaper/jobs"
)

// Defaults. WithDefaults applies them to zero fields; Load starts from them.
const (
	// RedisURLDefault is a Redis on the same host, database 0: asynq's own
	// default address.
	RedisURLDefault = "redis://127.0.0.1:6379/0"
	// SchemaDefault is the PostgreSQL schema of jobreaper's tables.
	SchemaDefault = jobs.SchemaDefault
	// IntervalDefault is the time between two daemon passes: short enough
	// that a stalled job is failed within a minute of crossing its limits,
	// long enough that a pass (a few Redis pages and one batched query) is
	// a small fraction of it.
	IntervalDefault = time.Minute
	// StallTimeoutDefault is the idle time after which a job past its
	// max_runtime is reaped, for job types whose stall_timeout is NULL. It
	// leaves room above the minimum 2 x HeartbeatIntervalDefault +
	// IntervalDefault = 11m, so one late heartbeat never reaps a live worker.
	StallTimeoutDefault = 15 * time.Minute
	// HeartbeatIntervalDefault is the worker library's heartbeat limiter:
	// at most one progress write per job per process every 5 minutes, which
	// keeps heartbeat writes cheap for long jobs.
	HeartbeatIntervalDefault = 5 * time.Minute
	// PageSizeDefault is the number of active tasks fetched per Redis page.
	PageSizeDefault = PageSizeMin
	// PageSizeMin is the smallest page size Validate accepts: asynq's
	// Inspector ships every payload and re-checks every expired lease on
	// each page, so small pages multiply that cost on a busy queue.
	PageSizeMin = 1000
	// ListerIDs, as lister, reads asynq's active lists directly: task IDs
	// only, in pipelined chunks (about 25 times faster than the Inspector
	// for 100,000 active tasks).
	ListerIDs = "ids"
	// ListerInspector, as lister, lists through asynq's Inspector, which
	// ships and decodes every task; it does not depend on asynq's key
	// layout.
	ListerInspector = "inspector"
	// ListerDefault is the ID-only lister.
	ListerDefault = ListerIDs
	// MetricsAddrDefault serves /metrics and /healthz on the loopback
	// interface only, so that a default install exposes nothing to the
	// network; a sidecar sets ":9468" for its pod's scraper. Port 9468 is
	// not used by Prometheus or its common exporters.
	MetricsAddrDefault = "127.0.0.1:9468"
	// MetricsAddrOff, as metrics_addr, starts no HTTP server.
	MetricsAddrOff = "off"
	// StatusAddrDefault serves the status page on the loopback interface
	// only, even where metrics_addr listens on every interface (the image
	// and the sidecar set ":9468"): the page shows job IDs, types and
	// workers, so it is exposed only where status_addr names an address
	// that is. Port 9469 is the one after the metrics port.
	StatusAddrDefault = "127.0.0.1:9469"
	// StatusAddrOff, as status_addr, starts no status page.
	StatusAddrOff = "off"
	// LogLevelDefault logs passes that changed something, warnings and
	// errors; a quiet pass logs at debug.
	LogLevelDefault = "info"
	// LogFormatDefault is slog's key=value text; "json" suits log shippers.
	LogFormatDefault = "text"
	// StartJitterDefault is the upper bound of the random delay before the
	// first pass, so that sidecars started together (one per worker pod)
	// do not scan in step.
	StartJitterDefault = time.Second
	// OpTimeoutDefault bounds each single PostgreSQL statement or Redis
	// call, so that a hung server costs one pass, not the daemon.
	OpTimeoutDefault = jobs.OpTimeoutDefault
	// StaleQueuedAfterDefault is how long a job may stay QUEUED before the
	// pass looks its task up to report it when asynq will never run it: an
	// hour is far beyond a healthy queue's wait, and short enough that a job
	// lost before any middleware ran is seen the same day.
	StaleQueuedAfterDefault = time.Hour
	// StaleQueuedLookupsPerPassDefault bounds the asynq lookups of QUEUED
	// rows one daemon pass makes (one pipeline of 1,000), so that a large
	// backlog of old pending tasks costs a pass little; the rest are looked
	// up by the next passes.
	StaleQueuedLookupsPerPassDefault = 1000
	// MarkerCheckWindowDefault is the time within which the daemon
	// re-asserts the marker of every job reaped in the last 7 days, a
	// slice per pass, whatever their number: a marker lost to a failover or
	// an eviction is back within an hour.
	MarkerCheckWindowDefault = time.Hour
	// MaxLostPerPassDefault is the most jobs one cycle over the lost-task
	// candidates may reap as lost_task. A cycle that would reap more reaps
	// none: that many tasks vanishing at once means Redis lost its data
	// (flushed, restarted without persistence, restored from an old
	// snapshot) rather than that that many workers died on a last attempt.
	// 0 (set in the file, the environment or --max-lost-per-pass 0) means
	// no limit; WithDefaults reads a zero as unset.
	MaxLostPerPassDefault = 100
	// OutageGraceDefault keeps idle time from counting across a PostgreSQL
	// outage: a live worker cannot write a heartbeat while PostgreSQL is
	// unreachable, and without the grace a routine failover longer than a
	// stall timeout would fail every running job.
	OutageGraceDefault = true
	// MaxStalledPerPassDefault is the most jobs one pass may reap as
	// stalled. A pass that would reap more reaps none and holds their
	// queues for a while (a stall-storm hold): that many active jobs going
	// idle at once is far likelier their workers losing PostgreSQL than
	// that many real hangs. 0 means no limit; WithDefaults reads a zero as
	// unset.
	MaxStalledPerPassDefault = 100
	// MaxStalledFractionDefault is the largest share of the active tasks a
	// pass judged that it may reap as stalled, once they are at least 10
	// (reaper.StormMinStalled): more than half of the fleet idle at once
	// is a storm, not a run of bad luck. 0 means no limit; WithDefaults
	// reads a zero as unset.
	MaxStalledFractionDefault = 0.5
	// StallStormHoldDefault, 0, makes a stall-storm hold last the longest
	// stall timeout among the held jobs' types: a worker that lost
	// PostgreSQL has its whole stall timeout again to show progress.
	StallStormHoldDefault time.Duration = 0
)

// Config is everything the jobreaper daemon and its commands are configured
// with. The zero value is not usable: start from Load, or from a literal
// passed through WithDefaults, and call Validate.
type Config struct {
	// DatabaseURL is the PostgreSQL connection URL. Required.
	DatabaseURL string `yaml:"database_url" koanf:"database_url"`
	// RedisURL is the Redis URL asynq uses (redis://, rediss:// or unix://).
	RedisURL string `yaml:"redis_url" koanf:"redis_url"`
	// Schema is the PostgreSQL schema of jobreaper's tables.
	Schema string `yaml:"schema" koanf:"schema"`
	// Queues are the asynq queues to scan. Empty: every queue asynq knows,
	// discovered again at every pass.
	Queues []string `yaml:"queues" koanf:"queues"`
	// Interval is the time between two daemon passes.
	Interval time.Duration `yaml:"interval" koanf:"interval"`
	// StallTimeout is the idle time (no progress) after which a job past
	// its type's max_runtime is reaped, for types whose stall_timeout is
	// NULL. It must be at least MinStallTimeout.
	StallTimeout time.Duration `yaml:"stall_timeout" koanf:"stall_timeout"`
	// HeartbeatInterval is the workers' heartbeat limiter: the longest gap
	// between two progress writes of a live job.
	HeartbeatInterval time.Duration `yaml:"heartbeat_interval" koanf:"heartbeat_interval"`
	// PageSize is the number of active tasks fetched per Redis page; at
	// least PageSizeMin.
	PageSize int `yaml:"page_size" koanf:"page_size"`
	// Lister is how active tasks are listed: ListerIDs or ListerInspector.
	Lister string `yaml:"lister" koanf:"lister"`
	// MetricsAddr is the host:port of the /metrics and /healthz server, or
	// MetricsAddrOff.
	MetricsAddr string `yaml:"metrics_addr" koanf:"metrics_addr"`
	// StatusAddr is the host:port of the status page, or StatusAddrOff.
	StatusAddr string `yaml:"status_addr" koanf:"status_addr"`
	// LogLevel is debug, info, warn or error.
	LogLevel string `yaml:"log_level" koanf:"log_level"`
	// LogFormat is text or json.
	LogFormat string `yaml:"log_format" koanf:"log_format"`
	// StartJitter is the upper bound of a random delay before the first
	// pass; 0 disables it (set it to 0s in the file or by flag: WithDefaults
	// reads a zero as unset).
	StartJitter time.Duration `yaml:"start_jitter" koanf:"start_jitter"`
	// OpTimeout bounds each single PostgreSQL statement or Redis call.
	OpTimeout time.Duration `yaml:"op_timeout" koanf:"op_timeout"`
	// StaleQueuedAfter is how long a job must have been QUEUED before it is
	// reported as stale when asynq will never run its task.
	StaleQueuedAfter time.Duration `yaml:"stale_queued_after" koanf:"stale_queued_after"`
	// StaleQueuedLookupsPerPass bounds the QUEUED rows one daemon pass looks
	// up in asynq; at least 1.
	StaleQueuedLookupsPerPass int `yaml:"stale_queued_lookups_per_pass" koanf:"stale_queued_lookups_per_pass"`
	// MarkerCheckWindow is the time within which the daemon re-asserts the
	// marker of every job reaped in the last 7 days; at least Interval.
	MarkerCheckWindow time.Duration `yaml:"marker_check_window" koanf:"marker_check_window"`
	// MaxLostPerPass is the most jobs one cycle over the lost-task
	// candidates may reap as lost_task; 0 means no limit.
	MaxLostPerPass int `yaml:"max_lost_per_pass" koanf:"max_lost_per_pass"`
	// MaxStalledPerPass is the most jobs one pass may reap as stalled; a
	// pass that would reap more reaps none and holds their queues. 0
	// means no limit.
	MaxStalledPerPass int `yaml:"max_stalled_per_pass" koanf:"max_stalled_per_pass"`
	// MaxStalledFraction is the largest share (0 to 1) of the active tasks
	// a pass judged that it may reap as stalled, once they are 10 or more;
	// a pass that would reap more holds them likewise. 0 means no limit.
	MaxStalledFraction float64 `yaml:"max_stalled_fraction" koanf:"max_stalled_fraction"`
	// StallStormHold is how long a stall-storm hold lasts; 0 means the
	// longest stall timeout among the held jobs' types.
	StallStormHold time.Duration `yaml:"stall_storm_hold" koanf:"stall_storm_hold"`
	// StrictQueues makes run --once refuse to run (exit 2) when a queue of
	// Queues is not known to asynq in the Redis it reads, rather than warn
	// and treat it as empty. Off by default: a queue appears in asynq only
	// at its first enqueue. The daemon only warns either way.
	StrictQueues bool `yaml:"strict_queues" koanf:"strict_queues"`
	// RedisCAFile is a PEM file of the certificate authorities that sign
	// the Redis server's certificate, for a rediss:// RedisURL; empty
	// trusts the system's roots. It has no default.
	RedisCAFile string `yaml:"redis_ca_file" koanf:"redis_ca_file"`
	// RedisTLSServerName, when set, is the name every Redis node's
	// certificate is verified against (sentinels, primary, replicas,
	// cluster nodes, or the one server), for a rediss:// RedisURL whose
	// certificates name something other than the addresses dialled.
	// Empty, the default, verifies each connection against the host of
	// the address it dialled.
	RedisTLSServerName string `yaml:"redis_tls_server_name" koanf:"redis_tls_server_name"`
	// OutageGrace makes idle time never count across a PostgreSQL outage:
	// after a restart, a failover or lost connections, no job idle since
	// before the outage's end is reaped for one stall timeout. nil means
	// the default, OutageGraceDefault (true), which WithDefaults sets: a
	// bool could not tell an unset value from false. Read it with
	// OutageGraceOn.
	OutageGrace *bool `yaml:"outage_grace" koanf:"outage_grace"`
	// Cascades are each job type's on_failed, on_completed and
	// on_requeued statements. They are read from the config file only (SQL
	// does not belong in a flag or an environment variable).
	Cascades jobs.Cascades `yaml:"cascades" koanf:"cascades"`
}

// WithDefaults returns a copy of c in which every zero field holds its
// default. Queues and Cascades have none: empty Queues means every queue,
// and no cascade is the default. DatabaseURL has none either: it is
// required.
func (c Config) WithDefaults() Config {
	c.RedisURL = cmp.Or(c.RedisURL, RedisURLDefault)
	c.Schema = cmp.Or(c.Schema, SchemaDefault)
	c.Interval = cmp.Or(c.Interval, IntervalDefault)
	c.StallTimeout = cmp.Or(c.StallTimeout, StallTimeoutDefault)
	c.HeartbeatInterval = cmp.Or(c.HeartbeatInterval, HeartbeatIntervalDefault)
	c.PageSize = cmp.Or(c.PageSize, PageSizeDefault)
	c.Lister = cmp.Or(c.Lister, ListerDefault)
	c.MetricsAddr = cmp.Or(c.MetricsAddr, MetricsAddrDefault)
	c.StatusAddr = cmp.Or(c.StatusAddr, StatusAddrDefault)
	c.LogLevel = cmp.Or(c.LogLevel, LogLevelDefault)
	c.LogFormat = cmp.Or(c.LogFormat, LogFormatDefault)
	c.StartJitter = cmp.Or(c.StartJitter, StartJitterDefault)
	c.OpTimeout = cmp.Or(c.OpTimeout, OpTimeoutDefault)
	c.StaleQueuedAfter = cmp.Or(c.StaleQueuedAfter, StaleQueuedAfterDefault)
	c.StaleQueuedLookupsPerPass = cmp.Or(c.StaleQueuedLookupsPerPass, StaleQueuedLookupsPerPassDefault)
	c.MarkerCheckWindow = cmp.Or(c.MarkerCheckWindow, MarkerCheckWindowDefault)
	c.MaxLostPerPass = cmp.Or(c.MaxLostPerPass, MaxLostPerPassDefault)
	if c.OutageGrace == nil {
		on := OutageGraceDefault
		c.OutageGrace = &on
	}
	c.MaxStalledPerPass = cmp.Or(c.MaxStalledPerPass, MaxStalledPerPassDefault)
	c.MaxStalledFraction = cmp.Or(c.MaxStalledFraction, MaxStalledFractionDefault)
	c.StallStormHold = cmp.Or(c.StallStormHold, StallStormHoldDefault)
	return c
}

// OutageGraceOn reports whether the outage grace is on: OutageGrace, or
// OutageGraceDefault when it is nil.
func (c Config) OutageGraceOn() bool {
	if c.OutageGrace == nil {
		return OutageGraceDefault
	}
	return *c.OutageGrace
}

// MinStallTimeout is 2 x HeartbeatInterval + Interval: the longest a live
// worker can look idle to the reaper. Its heartbeats land up to one
// HeartbeatInterval apart, one may land just after the limiter let the
// previous one through late, and the pass that reads it runs up to one
// Interval later. A stall timeout below it reaps live workers.
//
// A sum past time.Duration's range (about 292 years, from absurd settings)
// saturates at jobs.MaxDuration instead of wrapping around to a negative
// floor; see minStallTimeout.
func (c Config) MinStallTimeout() time.Duration {
	d, _ := c.minStallTimeout()
	return d
}

// minStallTimeout is MinStallTimeout and whether the exact sum is past
// jobs.MaxDuration (for non-negative settings; Validate reports negative
// ones on their own).
func (c Config) minStallTimeout() (d time.Duration, saturated bool) {
	hb, iv := max(c.HeartbeatInterval, 0), max(c.Interval, 0)
	if hb > (jobs.MaxDuration-iv)/2 {
		return jobs.MaxDuration, true
	}
	return 2*c.HeartbeatInterval + c.Interval, false
}

// StallRule returns the daemon-wide part of the stall rule for the reaper:
// StallTimeout as the default stall timeout, MinStallTimeout as the floor a
// job_types row must meet, and jobs.HardTimeoutDefault (24 h) as the
// hard_timeout of a type whose column is NULL: the asynq Timeout
// queue.Enqueue gives such a type's tasks, so the bad_limits rule checks
// what asynq really does.
func (c Config) StallRule() pgstore.StallRule {
	return pgstore.StallRule{
		DefaultStallTimeout: c.StallTimeout,
		MinStallTimeout:     c.MinStallTimeout(),
		DefaultHardTimeout:  jobs.HardTimeoutDefault,
	}
}
