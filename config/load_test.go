package config

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"

	"github.com/jobreaper/jobreaper/jobs"
)

// writeFile writes a YAML file into the test's temporary directory.
func writeFile(t *testing.T, yaml string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "jobreaper.yaml")
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// flags returns a FlagSet from RegisterFlags, parsed from args.
func flags(t *testing.T, args ...string) *pflag.FlagSet {
	t.Helper()
	fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
	RegisterFlags(fs)
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	return fs
}

func TestLoad(t *testing.T) {
	t.Parallel()

	t.Run("WithNoSourceReturnsTheDefaults", func(t *testing.T) {
		t.Parallel()
		got, err := Load(Sources{Flags: flags(t)})
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, Config{}.WithDefaults()) {
			t.Fatalf("got %+v", got)
		}
	})

	t.Run("FileOverridesDefaultsEnvOverridesFileFlagsOverrideEnv", func(t *testing.T) {
		t.Parallel()
		path := writeFile(t, `
database_url: postgres://file@db/app
redis_url: redis://file:6379/1
interval: 2m
stall_timeout: 30m
heartbeat_interval: 4m
queues: [file-a, file-b]
`)
		env := []string{
			"JOBREAPER_STALL_TIMEOUT=40m",
			"JOBREAPER_HEARTBEAT_INTERVAL=3m",
			"JOBREAPER_QUEUES=env-a, env-b",
			"PATH=/usr/bin",
		}
		got, err := Load(Sources{File: path, Environ: env, Flags: flags(t, "--heartbeat-interval=2m", "--queues", "flag-a")})
		if err != nil {
			t.Fatal(err)
		}
		if got.DatabaseURL != "postgres://file@db/app" || got.RedisURL != "redis://file:6379/1" || got.Interval != 2*time.Minute {
			t.Errorf("file values lost: %+v", got)
		}
		if got.StallTimeout != 40*time.Minute {
			t.Errorf("stall_timeout = %s, want the environment's 40m", got.StallTimeout)
		}
		if got.HeartbeatInterval != 2*time.Minute {
			t.Errorf("heartbeat_interval = %s, want the flag's 2m", got.HeartbeatInterval)
		}
		if !slices.Equal(got.Queues, []string{"flag-a"}) {
			t.Errorf("queues = %q, want the flag's", got.Queues)
		}
		if got.PageSize != PageSizeDefault || got.Schema != SchemaDefault {
			t.Errorf("unset values lost their defaults: %+v", got)
		}
	})

	t.Run("FlagsLeftAtTheirDefaultDoNotOverride", func(t *testing.T) {
		t.Parallel()
		got, err := Load(Sources{Environ: []string{"JOBREAPER_INTERVAL=3m"}, Flags: flags(t, "--schema", "jr")})
		if err != nil {
			t.Fatal(err)
		}
		if got.Interval != 3*time.Minute || got.Schema != "jr" {
			t.Fatalf("got interval %s schema %s", got.Interval, got.Schema)
		}
	})

	t.Run("ReadsEverySettingFromTheEnvironment", func(t *testing.T) {
		t.Parallel()
		env := []string{
			"JOBREAPER_DATABASE_URL=postgres://env@db/app", "JOBREAPER_REDIS_URL=redis://env:6379/2",
			"JOBREAPER_SCHEMA=jr", "JOBREAPER_QUEUES=a,b", "JOBREAPER_INTERVAL=2m",
			"JOBREAPER_STALL_TIMEOUT=20m", "JOBREAPER_HEARTBEAT_INTERVAL=4m", "JOBREAPER_PAGE_SIZE=2000",
			"JOBREAPER_LISTER=inspector",
			"JOBREAPER_METRICS_ADDR=:9999", "JOBREAPER_STATUS_ADDR=off", "JOBREAPER_LOG_LEVEL=debug",
			"JOBREAPER_LOG_FORMAT=json", "JOBREAPER_START_JITTER=0s", "JOBREAPER_OP_TIMEOUT=5s",
			"JOBREAPER_STALE_QUEUED_AFTER=2h", "JOBREAPER_STALE_QUEUED_LOOKUPS_PER_PASS=50",
			"JOBREAPER_MARKER_CHECK_WINDOW=3h", "JOBREAPER_MAX_LOST_PER_PASS=0", "JOBREAPER_STRICT_QUEUES=true", "JOBREAPER_OUTAGE_GRACE=false",
			"JOBREAPER_MAX_STALLED_PER_PASS=0", "JOBREAPER_MAX_STALLED_FRACTION=0.25", "JOBREAPER_STALL_STORM_HOLD=30m",
		}
		got, err := Load(Sources{Environ: env})
		if err != nil {
			t.Fatal(err)
		}
		want := Config{
			DatabaseURL: "postgres://env@db/app", RedisURL: "redis://env:6379/2", Schema: "jr",
			Queues: []string{"a", "b"}, Interval: 2 * time.Minute, StallTimeout: 20 * time.Minute,
			HeartbeatInterval: 4 * time.Minute, PageSize: 2000, Lister: "inspector",
			MetricsAddr: ":9999", StatusAddr: "off", LogLevel: "debug", LogFormat: "json", StartJitter: 0, OpTimeout: 5 * time.Second,
			StaleQueuedAfter: 2 * time.Hour, StaleQueuedLookupsPerPass: 50, MarkerCheckWindow: 3 * time.Hour, MaxLostPerPass: 0,
			StrictQueues: true, MaxStalledPerPass: 0, MaxStalledFraction: 0.25, StallStormHold: 30 * time.Minute,
			OutageGrace: ptr(false),
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("\n got %+v\nwant %+v", got, want)
		}
	})

	t.Run("IgnoresEmptyAndForeignEnvironmentVariables", func(t *testing.T) {
		t.Parallel()
		got, err := Load(Sources{Environ: []string{
			"JOBREAPER_INTERVAL=", "JOBREAPER_SERVICE_HOST=10.0.0.1", "JOBREAPER_PORT=tcp://10.0.0.1:9468",
		}})
		if err != nil {
			t.Fatal(err)
		}
		if got.Interval != IntervalDefault {
			t.Fatalf("interval = %s", got.Interval)
		}
	})

	t.Run("RefusesUnknownKeyInFileNamingIt", func(t *testing.T) {
		t.Parallel()
		path := writeFile(t, "stal_timeout: 30m\nfrobnicate: yes\n")
		_, err := Load(Sources{File: path})
		ps := problems(t, err)
		if len(ps) != 2 {
			t.Fatalf("want 2 problems, got %v", err)
		}
		if ps[0].Key != "frobnicate" || !strings.Contains(ps[0].Msg, path+` line 2: unknown key "frobnicate"`) ||
			!strings.Contains(ps[0].Msg, "known keys: database_url,") {
			t.Errorf("first problem: %s", ps[0].Msg)
		}
		if ps[1].Key != "stal_timeout" || ps[1].Msg != "config file "+path+` line 1: unknown key "stal_timeout" (did you mean "stall_timeout"?)` ||
			ps[1].Error() != ps[1].Msg {
			t.Errorf("second problem: %s", ps[1].Msg)
		}
	})

	t.Run("NamesFieldAndValueOfMalformedValues", func(t *testing.T) {
		t.Parallel()
		path := writeFile(t, `
interval: 5 minutes
stall_timeout: 900
page_size: lots
schema: 7
queues: {a: b}
strict_queues: yes
max_stalled_fraction: half
`)
		_, err := Load(Sources{File: path})
		want := []string{
			`max_stalled_fraction: "half" is not a number (write a decimal such as 0.5)`,
			`interval: "5 minutes" is not a duration (use Go syntax such as 5m or 90s)`,
			`stall_timeout: 900 is not a duration (use Go syntax such as 5m or 90s, with a unit)`,
			`page_size: "lots" is not a whole number`,
			`schema: 7 is not a string`,
			`queues: map[a:b] is not a list of names`,
			`strict_queues: "yes" is not true or false`,
		}
		ps := problems(t, err)
		if len(ps) != len(want) {
			t.Fatalf("want %d problems, got: %v", len(want), err)
		}
		for _, w := range want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("error lacks %q:\n%v", w, err)
			}
		}
	})

	t.Run("NamesEnvironmentValueThatIsNotADuration", func(t *testing.T) {
		t.Parallel()
		_, err := Load(Sources{Environ: []string{"JOBREAPER_INTERVAL=5 minutes"}})
		requireProblem(t, err, "interval", `interval: "5 minutes" is not a duration`)
		want := `interval: "5 minutes" is not a duration (use Go syntax such as 5m or 90s) (from environment JOBREAPER_INTERVAL)`
		if err.Error() != want {
			t.Fatalf("err = %q, want %q", err, want)
		}
	})

	// outage_grace defaults to true, which a zero bool could not say: the
	// file, the environment and the flag each turn it off (or on again),
	// and a value that is not a boolean is named with its source.
	t.Run("ReadsOutageGraceFromEverySource", func(t *testing.T) {
		t.Parallel()
		for _, c := range []struct {
			name string
			src  Sources
			want bool
		}{
			{"Default", Sources{}, true},
			{"File", Sources{File: writeFile(t, "outage_grace: false\n")}, false},
			{"Environment", Sources{Environ: []string{"JOBREAPER_OUTAGE_GRACE=false"}}, false},
			{"FlagOverEnvironment", Sources{Environ: []string{"JOBREAPER_OUTAGE_GRACE=false"}, Flags: flags(t, "--outage-grace")}, true},
			{"FlagFalse", Sources{Flags: flags(t, "--outage-grace=false")}, false},
		} {
			got, err := Load(c.src)
			if err != nil || got.OutageGrace == nil || got.OutageGraceOn() != c.want {
				t.Errorf("%s: outage_grace %v (%v), want %v", c.name, got.OutageGrace, err, c.want)
			}
		}
		_, err := Load(Sources{Environ: []string{"JOBREAPER_OUTAGE_GRACE=sometimes"}})
		want := `outage_grace: "sometimes" is not a boolean (use true or false) (from environment JOBREAPER_OUTAGE_GRACE)`
		if err == nil || err.Error() != want {
			t.Fatalf("err = %v, want %q", err, want)
		}
		if (Config{}).OutageGraceOn() != OutageGraceDefault {
			t.Fatal("a Config without outage_grace does not have the default")
		}
	})

	t.Run("NamesTheFileLineAndKeyOfAMalformedValue", func(t *testing.T) {
		t.Parallel()
		path := writeFile(t, "schema: jr\n\npage_size: lots\n")
		_, err := Load(Sources{File: path})
		want := `page_size: "lots" is not a whole number (from file ` + path + ` line 3 key page_size)`
		if err == nil || err.Error() != want {
			t.Fatalf("err = %v, want %q", err, want)
		}
	})

	t.Run("RefusesKeyWithoutValue", func(t *testing.T) {
		t.Parallel()
		_, err := Load(Sources{File: writeFile(t, "interval:\nqueues:\n")})
		requireProblem(t, err, "interval", "interval has no value")
	})

	t.Run("ReadsCascadesFromTheFileKeepingDottedTypeNames", func(t *testing.T) {
		t.Parallel()
		path := writeFile(t, `
cascades:
  report.export:
    on_failed:
      - UPDATE reports SET status = 'FAILED' WHERE id = @parent_id
    on_completed: UPDATE reports SET pending = pending - 1 WHERE id = @parent_id
    on_requeued: UPDATE reports SET status = 'RUNNING' WHERE id = @parent_id
`)
		got, err := Load(Sources{File: path})
		if err != nil {
			t.Fatal(err)
		}
		want := jobs.Cascades{"report.export": {
			OnFailed:    []string{"UPDATE reports SET status = 'FAILED' WHERE id = @parent_id"},
			OnCompleted: []string{"UPDATE reports SET pending = pending - 1 WHERE id = @parent_id"},
			OnRequeued:  []string{"UPDATE reports SET status = 'RUNNING' WHERE id = @parent_id"},
		}}
		if !reflect.DeepEqual(got.Cascades, want) {
			t.Fatalf("cascades = %#v", got.Cascades)
		}
	})

	t.Run("RefusesUnknownCascadeKey", func(t *testing.T) {
		t.Parallel()
		path := writeFile(t, "cascades:\n  crawl.site:\n    on_fail: [SELECT 1]\n")
		_, err := Load(Sources{File: path})
		requireProblem(t, err, `cascades["crawl.site"]`, `unknown key "on_fail"`, "on_failed, on_completed, on_requeued")
	})

	t.Run("SaysWhenTheFileIsMissingAndWhatToFix", func(t *testing.T) {
		t.Parallel()
		path := filepath.Join(t.TempDir(), "nope.yaml")
		_, err := Load(Sources{File: path})
		want := "config file " + path + " does not exist: fix the path given by --config or JOBREAPER_CONFIG"
		if err == nil || err.Error() != want {
			t.Fatalf("err = %v, want %q", err, want)
		}
	})

	t.Run("NamesTheFileAndLineOfAYAMLSyntaxError", func(t *testing.T) {
		t.Parallel()
		path := writeFile(t, "schema: jr\ninterval: [1m\n")
		_, err := Load(Sources{File: path})
		want := "config file " + path + " is not valid YAML: line 2: did not find expected ',' or ']'"
		if err == nil || err.Error() != want {
			t.Fatalf("err = %v, want %q", err, want)
		}
	})

	t.Run("NamesTheLineOfADuplicateKey", func(t *testing.T) {
		t.Parallel()
		path := writeFile(t, "interval: 1m\nschema: jr\ninterval: 2m\n")
		_, err := Load(Sources{File: path})
		want := "config file " + path + ` is not valid YAML: line 3: mapping key "interval" already defined at line 1`
		if err == nil || err.Error() != want {
			t.Fatalf("err = %v, want %q", err, want)
		}
	})

	t.Run("RefusesAFileThatIsNotAMapping", func(t *testing.T) {
		t.Parallel()
		path := writeFile(t, "- interval: 1m\n")
		_, err := Load(Sources{File: path})
		want := "config file " + path + " is not valid: line 1: the top level must be a mapping of settings (key: value), not a list"
		if err == nil || err.Error() != want {
			t.Fatalf("err = %v, want %q", err, want)
		}
	})

	t.Run("AnEmptyFileSetsNothing", func(t *testing.T) {
		t.Parallel()
		got, err := Load(Sources{File: writeFile(t, "# nothing yet\n")})
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, Config{}.WithDefaults()) {
			t.Fatalf("got %+v", got)
		}
	})

	t.Run("RefusesTheRemovedHardTimeoutDefaultKey", func(t *testing.T) {
		t.Parallel()
		path := writeFile(t, "interval: 1m\nhard_timeout_default: 24h\n")
		_, err := Load(Sources{File: path})
		requireProblem(t, err, "hard_timeout_default", "config file "+path+` line 2: unknown key "hard_timeout_default"`)
		// Neither a flag nor a read environment variable any more.
		if f, _, ok := Names("hard_timeout_default"); ok || flags(t).Lookup("hard-timeout-default") != nil {
			t.Fatalf("hard_timeout_default still has a flag %q", f)
		}
		got, err := Load(Sources{Environ: []string{"JOBREAPER_HARD_TIMEOUT_DEFAULT=1h"}})
		if err != nil || !reflect.DeepEqual(got, Config{}.WithDefaults()) {
			t.Fatalf("JOBREAPER_HARD_TIMEOUT_DEFAULT was read: %+v, %v", got, err)
		}
	})

	t.Run("NeverShowsAPasswordOfAMalformedURL", func(t *testing.T) {
		t.Parallel()
		_, err := Load(Sources{File: writeFile(t, "database_url: [postgres://u:s3cretpw@db/app]\nredis_url: 5\n")})
		if err == nil || strings.Contains(err.Error(), "s3cretpw") {
			t.Fatalf("err = %v", err)
		}
	})
}

func TestLoadWithOrigins(t *testing.T) {
	t.Parallel()
	path := writeFile(t, "schema: file_schema\ninterval: 2m\nstall_timeout: 30m\n")
	_, origins, err := LoadWithOrigins(Sources{
		File:    path,
		Environ: []string{"JOBREAPER_INTERVAL=3m", "JOBREAPER_PAGE_SIZE=2000"},
		Flags:   flags(t, "--page-size", "3000", "--log-level", "debug"),
	})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"schema":        "file " + path + " line 1 key schema",
		"interval":      "environment JOBREAPER_INTERVAL",
		"stall_timeout": "file " + path + " line 3 key stall_timeout",
		"page_size":     "flag --page-size",
		"log_level":     "flag --log-level",
		"op_timeout":    "default",
	}
	for key, w := range want {
		if got := origins.Of(key).String(); got != w {
			t.Errorf("origin of %s = %q, want %q", key, got, w)
		}
	}
}

func TestOriginsAnnotateValidateErrors(t *testing.T) {
	t.Parallel()

	t.Run("NamesTheFlagOfTheBadValue", func(t *testing.T) {
		t.Parallel()
		cfg, origins, err := LoadWithOrigins(Sources{
			Environ: []string{"JOBREAPER_DATABASE_URL=postgres://u@db/app"},
			Flags:   flags(t, "--log-format", "xml"),
		})
		if err != nil {
			t.Fatal(err)
		}
		err = origins.Annotate(cfg.Validate())
		want := `log_format "xml" is not a format: use text or json (from flag --log-format)`
		if err == nil || err.Error() != want {
			t.Fatalf("err = %v, want %q", err, want)
		}
	})

	t.Run("NamesEverySourceOfARuleAcrossSettings", func(t *testing.T) {
		t.Parallel()
		path := writeFile(t, "database_url: postgres://u@db/app\nheartbeat_interval: 10m\n")
		cfg, origins, err := LoadWithOrigins(Sources{File: path})
		if err != nil {
			t.Fatal(err)
		}
		err = origins.Annotate(cfg.Validate())
		want := "stall_timeout 15m0s is below 2 x heartbeat_interval (10m0s) + interval (1m0s) = 21m0s: " +
			"a live worker would be reaped between two heartbeats (stall_timeout is the default, " +
			"heartbeat_interval from file " + path + " line 2 key heartbeat_interval, interval is the default)"
		if err == nil || err.Error() != want {
			t.Fatalf("err = %v\nwant %s", err, want)
		}
	})

	t.Run("AddsNothingWhenEverySettingIsTheDefault", func(t *testing.T) {
		t.Parallel()
		cfg, origins, err := LoadWithOrigins(Sources{})
		if err != nil {
			t.Fatal(err)
		}
		err = origins.Annotate(cfg.Validate())
		want := "database_url is required: set --database-url or JOBREAPER_DATABASE_URL to a PostgreSQL URL such as postgres://user:password@host:5432/db"
		if err == nil || err.Error() != want {
			t.Fatalf("err = %v, want %q", err, want)
		}
	})

	t.Run("NeverShowsAPassword", func(t *testing.T) {
		t.Parallel()
		cfg, origins, err := LoadWithOrigins(Sources{Flags: flags(t,
			"--database-url", "postgres://u:s3cretpw@db:notaport/app", "--redis-url", "u:s3cretpw@cache:6379")})
		if err != nil {
			t.Fatal(err)
		}
		err = origins.Annotate(cfg.Validate())
		if err == nil || strings.Contains(err.Error(), "s3cretpw") {
			t.Fatalf("err = %v", err)
		}
		for _, w := range []string{"(from flag --database-url)", `redis_url "xxxxx@cache:6379" has no scheme`, "(from flag --redis-url)"} {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("err %q lacks %q", err, w)
			}
		}
	})
}

func TestOnly(t *testing.T) {
	t.Parallel()
	path := writeFile(t, "shema: jr\ninterval: 5 minutes\nstall_timeout: 1m\nredis_url: cache:6379\n"+
		"cascades:\n  crawl.site:\n    on_fail: [SELECT 1]\n")
	cfg, origins, err := LoadWithOrigins(Sources{File: path, Flags: flags(t, "--log-level", "loud")})
	err = errors.Join(err, origins.Annotate(cfg.Validate()))

	var keys []string
	for _, p := range problems(t, Only(err, MigrateKeys...)) {
		keys = append(keys, p.Key)
	}
	// The misspelt key stays (it may be a setting migrate uses); interval,
	// stall_timeout, redis_url, cascades and the missing database_url's
	// siblings are not migrate's.
	if strings.Join(keys, ",") != "shema,database_url,log_level" {
		t.Fatalf("problems kept for migrate: %v", keys)
	}
	if Only(nil, MigrateKeys...) != nil {
		t.Fatal("Only(nil) is not nil")
	}
	c := valid()
	c.StallTimeout, c.RedisURL, c.Queues, c.MetricsAddr = time.Minute, "cache:6379", []string{""}, "nowhere"
	if err := Only(c.Validate(), MigrateKeys...); err != nil {
		t.Fatalf("daemon-only problems kept: %v", err)
	}
}

func TestConfigFile(t *testing.T) {
	t.Parallel()
	env := []string{"JOBREAPER_CONFIG=/etc/jobreaper/env.yaml"}
	if got := ConfigFile(flags(t, "--config", "/tmp/flag.yaml"), env); got != "/tmp/flag.yaml" {
		t.Errorf("flag: got %q", got)
	}
	if got := ConfigFile(flags(t), env); got != "/etc/jobreaper/env.yaml" {
		t.Errorf("env: got %q", got)
	}
	if got := ConfigFile(nil, nil); got != "" {
		t.Errorf("none: got %q", got)
	}
}

func TestRegisterFlags(t *testing.T) {
	t.Parallel()
	fs := flags(t)
	for _, s := range settings {
		if fs.Lookup(flagName(s.key)) == nil {
			t.Errorf("no flag for %s", s.key)
		}
	}
	if got := fs.Lookup("stall-timeout").DefValue; got != "15m0s" {
		t.Errorf("--stall-timeout default shown as %q", got)
	}
	if flag, env, ok := Names("stall_timeout"); !ok || flag != "--stall-timeout" || env != "JOBREAPER_STALL_TIMEOUT" {
		t.Errorf("Names(stall_timeout) = %s %s %v", flag, env, ok)
	}
	// A bool setting is a switch: --strict-queues alone sets it, and so do
	// the file and the environment with true or false.
	if f := fs.Lookup("strict-queues"); f == nil || f.DefValue != "false" || f.NoOptDefVal != "true" {
		t.Errorf("--strict-queues = %+v, want a bool flag defaulting to false", f)
	}
	for _, src := range []Sources{
		{Flags: flags(t, "--strict-queues")},
		{Environ: []string{"JOBREAPER_STRICT_QUEUES=1"}},
		{File: writeFile(t, "strict_queues: true\n")},
	} {
		if got, err := Load(src); err != nil || !got.StrictQueues {
			t.Errorf("Load(%+v): strict_queues = %v, %v; want true", src, got.StrictQueues, err)
		}
	}
	if got, err := Load(Sources{Environ: []string{"JOBREAPER_STRICT_QUEUES=true"}, Flags: flags(t, "--strict-queues=false")}); err != nil || got.StrictQueues {
		t.Errorf("--strict-queues=false over the environment's true: %v, %v; want false", got.StrictQueues, err)
	}
	// A float setting reads a decimal from each source, and a whole number
	// from the file; NaN and the infinities are no limit anyone meant.
	if f := fs.Lookup("max-stalled-fraction"); f == nil || f.DefValue != "0.5" || f.Value.Type() != "float64" {
		t.Errorf("--max-stalled-fraction = %+v, want a float flag defaulting to 0.5", f)
	}
	for _, src := range []Sources{
		{Flags: flags(t, "--max-stalled-fraction", "0.25")},
		{Environ: []string{"JOBREAPER_MAX_STALLED_FRACTION=0.25"}},
		{File: writeFile(t, "max_stalled_fraction: 0.25\n")},
	} {
		if got, err := Load(src); err != nil || got.MaxStalledFraction != 0.25 {
			t.Errorf("Load(%+v): max_stalled_fraction = %v, %v; want 0.25", src, got.MaxStalledFraction, err)
		}
	}
	if got, err := Load(Sources{File: writeFile(t, "max_stalled_fraction: 1\n")}); err != nil || got.MaxStalledFraction != 1 {
		t.Errorf("max_stalled_fraction: 1 in the file = %v, %v; want 1", got.MaxStalledFraction, err)
	}
	for _, src := range []Sources{
		{Flags: flags(t, "--max-stalled-fraction", "NaN")},
		{Environ: []string{"JOBREAPER_MAX_STALLED_FRACTION=+Inf"}},
		{File: writeFile(t, "max_stalled_fraction: .nan\n")},
	} {
		if _, err := Load(src); err == nil || !strings.Contains(err.Error(), "max_stalled_fraction") || !strings.Contains(err.Error(), "is not a finite number") {
			t.Errorf("Load(%+v) = %v, want max_stalled_fraction refused as not a finite number", src, err)
		}
	}
}

// A malformed value that a later source overrides is still an error,
// named where it is: it is wrong, and it would be used the day the
// override is dropped. Well-formed overridden values are no error.
func TestLoadRefusesAMalformedValueALaterSourceOverrides(t *testing.T) {
	t.Parallel()
	path := writeFile(t, "interval: banana\npage_size: 500\n")
	_, err := Load(Sources{File: path, Environ: []string{"JOBREAPER_INTERVAL=5s", "JOBREAPER_PAGE_SIZE=many"},
		Flags: flags(t, "--page-size", "3000")})
	if err == nil {
		t.Fatal("Load accepted a malformed interval in the file under a well-formed variable")
	}
	for _, want := range []string{
		`interval: "banana" is not a duration`, "from file " + path + " line 1 key interval",
		"page_size", "from environment JOBREAPER_PAGE_SIZE",
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q:\n%v", want, err)
		}
	}
	cfg, err := Load(Sources{File: writeFile(t, "interval: 2m\n"), Environ: []string{"JOBREAPER_INTERVAL=5s"}})
	if err != nil || cfg.Interval != 5*time.Second {
		t.Fatalf("well-formed override: interval %s, err %v; want 5s and no error", cfg.Interval, err)
	}
}

// A comma-separated queue list is read the same from a flag, a variable
// and a string in the file: items trimmed.
func TestQueuesAreTrimmedAlikeInEveryCommaSeparatedSource(t *testing.T) {
	t.Parallel()
	for name, src := range map[string]Sources{
		"flag": {Flags: flags(t, "--queues", "a, b")},
		"env":  {Environ: []string{"JOBREAPER_QUEUES=a, b"}},
		"file": {File: writeFile(t, "queues: \"a, b\"\n")},
	} {
		cfg, err := Load(src)
		if err != nil || strings.Join(cfg.Queues, "|") != "a|b" {
			t.Errorf("%s: queues %q, err %v; want [a b]", name, cfg.Queues, err)
		}
	}
}

// A directory given as the config file is named as such, not blamed on
// its permissions.
func TestLoadSaysAConfigDirectoryIsADirectory(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	_, err := Load(Sources{File: dir})
	if err == nil || !strings.Contains(err.Error(), "is a directory") || strings.Contains(err.Error(), "permissions") {
		t.Fatalf("Load(directory) = %v, want an error saying it is a directory", err)
	}
}
