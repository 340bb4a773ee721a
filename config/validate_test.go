package config

import (
	"math"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/jobreaper/jobreaper/jobs"
)

func TestValidate(t *testing.T) {
	t.Parallel()

	tests := []struct {
		name      string
		mutate    func(*Config)
		key       string
		fragments []string
	}{
		{"RequiresDatabaseURL", func(c *Config) { c.DatabaseURL = "" }, "database_url",
			[]string{"database_url is required", "--database-url", "JOBREAPER_DATABASE_URL"}},
		{"RefusesUnparseableDatabaseURL", func(c *Config) { c.DatabaseURL = "postgres://u@db/app?sslmode=sometimes" }, "database_url",
			[]string{"not a valid PostgreSQL connection URL", "postgres://u@db/app?sslmode=sometimes"}},
		{"RefusesRedisURLWithOtherScheme", func(c *Config) { c.RedisURL = "http://cache:6379" }, "redis_url",
			[]string{"http://cache:6379", "invalid URL scheme", "redis://"}},
		{"RefusesRedisURLWithoutScheme", func(c *Config) { c.RedisURL = "127.0.0.1:6379" }, "redis_url",
			[]string{`redis_url "127.0.0.1:6379" has no scheme: write it as a URL such as redis://127.0.0.1:6379/0`}},
		{"RefusesRedisHostWithoutScheme", func(c *Config) { c.RedisURL = "cache.internal:6380" }, "redis_url",
			[]string{`redis_url "cache.internal:6380" has no scheme: write it as a URL such as redis://cache.internal:6380/0`}},
		{"RefusesRedisURLWithoutSchemeHidingAPassword", func(c *Config) { c.RedisURL = ":s3cretpw@cache:6379/0" }, "redis_url",
			[]string{`redis_url "xxxxx@cache:6379/0" has no scheme: write it as a URL such as redis://127.0.0.1:6379/0`}},
		{"RefusesRedisURLWithoutSchemeNotShowingOtherForms", func(c *Config) { c.RedisURL = "password=s3cretpw host=cache" }, "redis_url",
			[]string{`redis_url (not shown: it may hold a password) has no scheme: write it as a URL such as redis://127.0.0.1:6379/0`}},
		{"RefusesDatabaseURLWithoutScheme", func(c *Config) { c.DatabaseURL = "db.internal:5432" }, "database_url",
			[]string{`database_url "db.internal:5432" has no scheme: write it as a URL such as postgres://user:password@db.internal:5432/db`}},
		{"RefusesEmptyRedisURL", func(c *Config) { c.RedisURL = "" }, "redis_url", []string{"required"}},
		{"RefusesSchemaThatIsNotAnIdentifier", func(c *Config) { c.Schema = "my-schema" }, "schema",
			[]string{`"my-schema"`, "plain PostgreSQL identifier"}},
		{"RefusesInformationSchema", func(c *Config) { c.Schema = "information_schema" }, "schema",
			[]string{`"information_schema"`, "PostgreSQL's own"}},
		{"RefusesAPgSchema", func(c *Config) { c.Schema = "pg_catalog" }, "schema",
			[]string{`"pg_catalog"`, "PostgreSQL's own"}},
		{"RefusesEmptyQueueName", func(c *Config) { c.Queues = []string{"critical", ""} }, "queues",
			[]string{"queues item 2 is empty"}},
		{"RefusesQueueNameWithSpaces", func(c *Config) { c.Queues = []string{" critical"} }, "queues",
			[]string{`" critical"`, "surrounding spaces"}},
		{"RefusesDuplicateQueue", func(c *Config) { c.Queues = []string{"a", "a"} }, "queues",
			[]string{`item 2 "a" is listed twice`}},
		{"RefusesQueueNameNoTextCanHold", func(c *Config) { c.Queues = []string{"a", "tenant\x00eu"} }, "queues",
			[]string{`queues item 2: queue name "tenant\x00eu" contains a NUL byte`, "a jobs row cannot name such a queue"}},
		{"RefusesZeroInterval", func(c *Config) { c.Interval = 0; c.StallTimeout = time.Hour }, "interval",
			[]string{"interval 0s must be positive"}},
		{"RefusesNegativeStallTimeout", func(c *Config) { c.StallTimeout = -time.Minute }, "stall_timeout",
			[]string{"stall_timeout -1m0s must be positive"}},
		{"RefusesZeroHeartbeatInterval", func(c *Config) { c.HeartbeatInterval = 0 }, "heartbeat_interval",
			[]string{"heartbeat_interval 0s must be positive"}},
		{"RefusesZeroOpTimeout", func(c *Config) { c.OpTimeout = 0 }, "op_timeout",
			[]string{"op_timeout 0s must be positive"}},
		{"RefusesNegativeStartJitter", func(c *Config) { c.StartJitter = -time.Second }, "start_jitter",
			[]string{"start_jitter -1s is negative"}},
		{"RefusesNegativeMaxLostPerPass", func(c *Config) { c.MaxLostPerPass = -1 }, "max_lost_per_pass",
			[]string{"max_lost_per_pass -1 is negative"}},
		{"RefusesNegativeMaxStalledPerPass", func(c *Config) { c.MaxStalledPerPass = -1 }, "max_stalled_per_pass",
			[]string{"max_stalled_per_pass -1 is negative"}},
		{"RefusesNegativeMaxStalledFraction", func(c *Config) { c.MaxStalledFraction = -0.1 }, "max_stalled_fraction",
			[]string{"max_stalled_fraction -0.1 is not between 0 and 1"}},
		{"RefusesMaxStalledFractionAboveOne", func(c *Config) { c.MaxStalledFraction = 1.5 }, "max_stalled_fraction",
			[]string{"max_stalled_fraction 1.5 is not between 0 and 1", "share of the active tasks"}},
		{"RefusesNaNMaxStalledFraction", func(c *Config) { c.MaxStalledFraction = math.NaN() }, "max_stalled_fraction",
			[]string{"max_stalled_fraction NaN is not between 0 and 1"}},
		{"RefusesNegativeStallStormHold", func(c *Config) { c.StallStormHold = -time.Minute }, "stall_storm_hold",
			[]string{"stall_storm_hold -1m0s is negative"}},
		{"RefusesMarkerCheckWindowBelowInterval", func(c *Config) { c.MarkerCheckWindow = 30 * time.Second }, "marker_check_window",
			[]string{"marker_check_window 30s is below interval 1m0s"}},
		{"RefusesStaleQueuedLookupsBelowOne", func(c *Config) { c.StaleQueuedLookupsPerPass = 0 }, "stale_queued_lookups_per_pass",
			[]string{"stale_queued_lookups_per_pass 0 is below 1"}},
		{"RefusesStaleQueuedAfterNotPositive", func(c *Config) { c.StaleQueuedAfter = -time.Minute }, "stale_queued_after",
			[]string{"stale_queued_after -1m0s must be positive"}},
		{"RefusesPageSizeBelowMinimum", func(c *Config) { c.PageSize = 999 }, "page_size",
			[]string{"page_size 999 is below the minimum 1000"}},
		{"RefusesUnknownLister", func(c *Config) { c.Lister = "raw" }, "lister",
			[]string{`lister "raw" is not a lister: use ids or inspector`}},
		{"RefusesStatusAddrWithoutPort", func(c *Config) { c.StatusAddr = "localhost" }, "status_addr",
			[]string{`status_addr "localhost" is not host:port`}},
		{"RefusesStatusAddrWithBadPort", func(c *Config) { c.StatusAddr = "127.0.0.1:70000" }, "status_addr",
			[]string{`status_addr "127.0.0.1:70000" is not host:port`}},
		{"RefusesMetricsAddrWithoutPort", func(c *Config) { c.MetricsAddr = "localhost" }, "metrics_addr",
			[]string{`metrics_addr "localhost" is not host:port`}},
		{"RefusesMetricsAddrWithBadPort", func(c *Config) { c.MetricsAddr = ":70000" }, "metrics_addr",
			[]string{`":70000"`}},
		{"RefusesUnknownLogLevel", func(c *Config) { c.LogLevel = "verbose" }, "log_level",
			[]string{`log_level "verbose"`, "debug, info, warn or error"}},
		{"RefusesUnknownLogFormat", func(c *Config) { c.LogFormat = "xml" }, "log_format",
			[]string{`log_format "xml"`, "text or json"}},
		{"RefusesEmptyCascadeStatement", func(c *Config) {
			c.Cascades = jobs.Cascades{"report.export": {OnFailed: []string{"UPDATE parents SET failed = failed + 1", " "}}}
		}, "cascades", []string{`cascade on_failed of type "report.export", statement 2 is empty`}},
		{"RefusesCascadeWithoutTypeName", func(c *Config) {
			c.Cascades = jobs.Cascades{"": {OnFailed: []string{"SELECT 1"}}}
		}, "cascades", []string{"a job type name is empty"}},
		{"RefusesCascadeWithUnknownArgument", func(c *Config) {
			c.Cascades = jobs.Cascades{"crawl.site": {OnCompleted: []string{"UPDATE sites SET done = true WHERE id = @parent"}}}
		}, "cascades", []string{`cascade on_completed of type "crawl.site", statement 1 uses @parent`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c := valid()
			tt.mutate(&c)
			requireProblem(t, c.Validate(), tt.key, tt.fragments...)
		})
	}

	t.Run("AcceptsMetricsOffAndZeroStartJitter", func(t *testing.T) {
		t.Parallel()
		c := valid()
		c.MetricsAddr, c.StatusAddr, c.StartJitter = MetricsAddrOff, StatusAddrOff, 0
		if err := c.Validate(); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("ReportsEveryProblemAtOnce", func(t *testing.T) {
		t.Parallel()
		c := valid()
		c.DatabaseURL, c.LogLevel, c.PageSize = "", "loud", 10
		ps := problems(t, c.Validate())
		var keys []string
		for _, p := range ps {
			keys = append(keys, p.Key)
		}
		if strings.Join(keys, ",") != "database_url,page_size,log_level" {
			t.Fatalf("problems %v, want database_url, page_size and log_level", keys)
		}
	})

	t.Run("AcceptsStallTimeoutEqualToTheMinimum", func(t *testing.T) {
		t.Parallel()
		c := valid()
		c.StallTimeout = 11 * time.Minute // 2 x 5m + 1m
		if err := c.Validate(); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("NeverShowsAPassword", func(t *testing.T) {
		t.Parallel()
		for i, c := range []Config{
			{DatabaseURL: "postgres://u:s3cretpw@db:notaport/app", RedisURL: "redis://:s3cretpw@cache:6379/x"},
			{DatabaseURL: "postgres://u:s3cretpw@db host/app", RedisURL: "redis://:s3cretpw@cache:bad port/0"},
			{DatabaseURL: "host=db password=s3cretpw port=notaport", RedisURL: "http://u:s3cretpw@cache:6379"},
			{DatabaseURL: "postgres://u:s3cretpw@db/app?password=s3cretpw&port=x", RedisURL: "redis://u:s3cretpw@cache:6379/99999999999999999999"},
			{DatabaseURL: "u:s3cretpw@db:5432/app", RedisURL: "u:s3cretpw@cache:6379"},
			{DatabaseURL: "db:5432 password=s3cretpw", RedisURL: "password=s3cretpw host=cache"},
		} {
			err := c.WithDefaults().Validate()
			if err == nil {
				t.Fatalf("config %d should not validate", i)
			}
			if strings.Contains(err.Error(), "s3cretpw") {
				t.Fatalf("password in error: %s", err)
			}
			for _, p := range problems(t, err) {
				if p.Key != "database_url" && p.Key != "redis_url" {
					t.Fatalf("unexpected problem: %s", p.Msg)
				}
			}
		}
	})
}

// An absurdly long heartbeat_interval or interval must not wrap 2 x
// heartbeat_interval + interval around to a negative floor that every
// stall timeout passes (found by FuzzLoadConfigFile's seeds).
func TestValidateRefusesAStallFloorPastTheLongestDuration(t *testing.T) {
	t.Parallel()
	for name, mutate := range map[string]func(*Config){
		"HeartbeatInterval": func(c *Config) { c.HeartbeatInterval = 1562500 * time.Hour },
		"Interval": func(c *Config) {
			c.Interval, c.MarkerCheckWindow = 2562047*time.Hour, 2562047*time.Hour
			c.HeartbeatInterval = time.Hour
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			c := valid()
			c.StallTimeout = 12 * time.Minute
			mutate(&c)
			requireProblem(t, c.Validate(), "stall_timeout", "stall_timeout 12m0s is below 2 x heartbeat_interval (",
				"longer than the longest duration (about 292 years)")
			if c.MinStallTimeout() <= 0 {
				t.Fatalf("MinStallTimeout() = %s, want it saturated, not wrapped around", c.MinStallTimeout())
			}
		})
	}
}

func TestCase_B15_StallTimeoutBelowTwoHeartbeatsPlusIntervalIsRefused(t *testing.T) {
	t.Parallel()
	c := valid()
	c.StallTimeout, c.HeartbeatInterval, c.Interval = 5*time.Minute, 5*time.Minute, time.Minute
	before := c

	err := c.Validate()

	requireProblem(t, err, "stall_timeout",
		"stall_timeout 5m0s is below 2 x heartbeat_interval (5m0s) + interval (1m0s) = 11m0s",
		"a live worker would be reaped between two heartbeats")
	if c.StallTimeout != 5*time.Minute || c.StallRule().DefaultStallTimeout != 5*time.Minute {
		t.Fatalf("stall timeout was changed to %s: it must never be clamped", c.StallTimeout)
	}
	if c.StallRule().MinStallTimeout != 11*time.Minute {
		t.Fatalf("MinStallTimeout = %s, want 11m0s", c.StallRule().MinStallTimeout)
	}
	if !reflect.DeepEqual(before, c) {
		t.Fatalf("Validate changed the config: %+v -> %+v", before, c)
	}
}
