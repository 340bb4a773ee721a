package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"
	"time"

	"github.com/jobreaper/jobreaper/config"
)

// requireJSONError fails unless stdout is exactly one JSON document
// {"error": msg} whose message is the one line on stderr, and returns msg.
func requireJSONError(t *testing.T, r result) string {
	t.Helper()
	dec := json.NewDecoder(strings.NewReader(r.stdout))
	dec.DisallowUnknownFields()
	var doc struct {
		Error *string `json:"error"`
	}
	if err := dec.Decode(&doc); err != nil || doc.Error == nil {
		t.Fatalf("stdout is not {\"error\": ...}: %v\n%q", err, r.stdout)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		t.Fatalf("stdout holds more than one JSON document: %q", r.stdout)
	}
	if r.stderr != "jobreaper: "+*doc.Error+"\n" {
		t.Fatalf("stderr %q is not the JSON error %q on one line", r.stderr, *doc.Error)
	}
	return *doc.Error
}

func TestRunOnceJSONCouldNotRun(t *testing.T) {
	t.Parallel()

	t.Run("UnreachableDatabasePrintsOneJSONErrorWithoutThePassword", func(t *testing.T) {
		t.Parallel()
		r := run(t, "run", "--once", "--output", "json", "--database-url", "postgres://postgres:secret@127.0.0.1:1/x", "--queues", "q")
		requireExit(t, r, exitCannotRun)
		msg := requireJSONError(t, r)
		if !strings.Contains(msg, "cannot connect to PostgreSQL at postgres://postgres:xxxxx@127.0.0.1:1/x") ||
			!strings.Contains(msg, "check --database-url") {
			t.Fatalf("error = %q", msg)
		}
		if strings.Contains(r.stdout+r.stderr, "secret") {
			t.Fatalf("the password leaked: %q", r.stdout)
		}
	})

	t.Run("InvalidConfigurationPrintsOneJSONError", func(t *testing.T) {
		t.Parallel()
		r := run(t, "run", "--once", "--output=json", "--database-url", "postgres://u@127.0.0.1:1/x", "--redis-url", "127.0.0.1:6379")
		requireExit(t, r, exitCannotRun)
		want := `invalid configuration: redis_url "127.0.0.1:6379" has no scheme: write it as a URL such as redis://127.0.0.1:6379/0 ` +
			`(rediss:// for TLS, unix:///path for a socket) (from flag --redis-url)`
		if msg := requireJSONError(t, r); msg != want {
			t.Fatalf("error = %q\nwant    %q", msg, want)
		}
	})

	t.Run("MalformedFlagsPrintOneJSONError", func(t *testing.T) {
		t.Parallel()
		for _, args := range [][]string{
			{"run", "--once", "--output", "json", "--interval", "abc"},
			{"run", "--interval", "abc", "--once", "--output=json"},
			{"run", "--once", "--output", "json", "--bogus"},
		} {
			r := run(t, args...)
			requireExit(t, r, exitCannotRun)
			if msg := requireJSONError(t, r); !strings.Contains(msg, "see jobreaper run --help") {
				t.Fatalf("%v: error = %q, want the flag problem and the help pointer", args, msg)
			}
		}
		// Without --once, stdout stays empty, as for any daemon error.
		r := run(t, "run", "--output", "json", "--interval", "abc")
		requireExit(t, r, exitCannotRun)
		if r.stdout != "" {
			t.Fatalf("run without --once printed %q on stdout", r.stdout)
		}
	})

	t.Run("TextOutputKeepsStdoutEmpty", func(t *testing.T) {
		t.Parallel()
		r := run(t, "run", "--once", "--database-url", "postgres://u@127.0.0.1:1/x", "--redis-url", "127.0.0.1:6379")
		requireExit(t, r, exitCannotRun)
		requireOneLineError(t, r, `redis_url "127.0.0.1:6379" has no scheme`)
	})

	t.Run("OutputWithoutOnceExits2", func(t *testing.T) {
		t.Parallel()
		r := run(t, "run", "--output", "json", "--database-url", "postgres://u@127.0.0.1:1/x")
		requireExit(t, r, exitCannotRun)
		requireOneLineError(t, r, "--output applies to --once only")
	})
}

func TestConfigErrorsSayWhereTheValueCameFrom(t *testing.T) {
	t.Parallel()

	t.Run("MissingConfigFile", func(t *testing.T) {
		t.Parallel()
		path := filepath.Join(t.TempDir(), "nope.yaml")
		r := run(t, "run", "--once", "--config", path)
		requireExit(t, r, exitCannotRun)
		want := "jobreaper: invalid configuration: config file " + path +
			" does not exist: fix the path given by --config or JOBREAPER_CONFIG\n"
		if r.stderr != want || r.stdout != "" {
			t.Fatalf("stdout %q stderr %q, want stderr %q", r.stdout, r.stderr, want)
		}
	})

	t.Run("YAMLSyntaxErrorNamesFileAndLine", func(t *testing.T) {
		t.Parallel()
		path := filepath.Join(t.TempDir(), "jobreaper.yaml")
		if err := os.WriteFile(path, []byte("schema: jr\nqueues: [a, b\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		r := run(t, "run", "--once", "--config", path)
		requireExit(t, r, exitCannotRun)
		want := "jobreaper: invalid configuration: config file " + path +
			" is not valid YAML: line 2: did not find expected ',' or ']'\n"
		if r.stderr != want {
			t.Fatalf("stderr %q, want %q", r.stderr, want)
		}
	})

	t.Run("ValueFromTheFileNamesFileLineAndKey", func(t *testing.T) {
		t.Parallel()
		path := filepath.Join(t.TempDir(), "jobreaper.yaml")
		if err := os.WriteFile(path, []byte("database_url: postgres://u@127.0.0.1:1/x\nlog_format: xml\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		r := run(t, "migrate", "--config", path)
		requireExit(t, r, exitCannotRun)
		want := `jobreaper: invalid configuration: log_format "xml" is not a format: use text or json (from file ` +
			path + " line 2 key log_format)\n"
		if r.stderr != want {
			t.Fatalf("stderr %q, want %q", r.stderr, want)
		}
	})

	t.Run("NoGenericHint", func(t *testing.T) {
		t.Parallel()
		r := run(t, "run", "--once", "--database-url", "postgres://u@127.0.0.1:1/x", "--page-size", "10")
		requireExit(t, r, exitCannotRun)
		requireOneLineError(t, r, "page_size 10 is below the minimum 1000", "(from flag --page-size)")
		if strings.Contains(r.stderr, "key-name") || strings.Contains(r.stderr, "KEY_NAME") {
			t.Fatalf("stderr carries the generic hint: %q", r.stderr)
		}
	})
}

// Not parallel: it sets an environment variable the command reads.
func TestConfigErrorNamesTheEnvironmentVariable(t *testing.T) {
	t.Setenv("JOBREAPER_LOG_LEVEL", "loud")
	r := run(t, "migrate", "--database-url", "postgres://u@127.0.0.1:1/x")
	requireExit(t, r, exitCannotRun)
	want := `jobreaper: invalid configuration: log_level "loud" is not a level: use debug, info, warn or error (from environment JOBREAPER_LOG_LEVEL)` + "\n"
	if r.stderr != want {
		t.Fatalf("stderr %q, want %q", r.stderr, want)
	}
}

func TestLoggerWritesDurationsAsGoDurations(t *testing.T) {
	t.Parallel()
	for _, format := range []string{"json", "text"} {
		t.Run(format, func(t *testing.T) {
			t.Parallel()
			var buf bytes.Buffer
			cfg := config.Config{LogLevel: "info", LogFormat: format}
			newLogger(cfg, &buf).With("component", "test").Info("job reaped",
				"idle", 3*time.Minute, "runtime", 31*time.Minute+500*time.Millisecond, "generation", 2,
				slog.Group("limits", "stall_timeout", 15*time.Minute))
			line := buf.String()
			if format == "text" {
				for _, want := range []string{"idle=3m0s", "runtime=31m0.5s", "generation=2", "limits.stall_timeout=15m0s"} {
					if !strings.Contains(line, want) {
						t.Errorf("text line %q lacks %q", line, want)
					}
				}
				return
			}
			var doc map[string]any
			if err := json.Unmarshal([]byte(line), &doc); err != nil {
				t.Fatalf("not JSON: %v: %q", err, line)
			}
			limits, _ := doc["limits"].(map[string]any)
			if doc["idle"] != "3m0s" || doc["runtime"] != "31m0.5s" || doc["generation"] != 2.0 || limits["stall_timeout"] != "15m0s" {
				t.Fatalf("JSON line %q: idle %v runtime %v generation %v limits %v", line, doc["idle"], doc["runtime"], doc["generation"], doc["limits"])
			}
		})
	}
}

func TestVersion(t *testing.T) {
	t.Parallel()

	t.Run("CommandAndFlagPrintTheSameLine", func(t *testing.T) {
		t.Parallel()
		cmd := run(t, "version")
		requireExit(t, cmd, exitOK)
		flag := run(t, "--version")
		requireExit(t, flag, exitOK)
		want := "jobreaper " + version() + "\n"
		if cmd.stdout != want || flag.stdout != want || cmd.stderr != "" || flag.stderr != "" {
			t.Fatalf("version printed %q / %q, want %q", cmd.stdout, flag.stdout, want)
		}
		if !strings.HasSuffix(want, ", "+runtime.Version()+"\n") {
			t.Fatalf("%q does not end with the Go version", want)
		}
	})

	t.Run("FromBuildInformation", func(t *testing.T) {
		t.Parallel()
		tests := []struct {
			name string
			bi   *debug.BuildInfo
			want string
		}{
			{"NoBuildInformation", nil, "devel, go1.26.0"},
			{"DevelWithoutVCS", &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}}, "devel, go1.26.0"},
			{"TaggedAndClean", &debug.BuildInfo{
				Main: debug.Module{Version: "v1.2.3"},
				Settings: []debug.BuildSetting{
					{Key: "vcs", Value: "git"}, {Key: "vcs.revision", Value: "583cf85aa1b2"}, {Key: "vcs.modified", Value: "false"},
				},
			}, "v1.2.3, revision 583cf85aa1b2, go1.26.0"},
			{"PseudoVersionModified", &debug.BuildInfo{
				Main:     debug.Module{Version: "v0.0.0-20261129113914-dbbcc6b57c9c+dirty"},
				Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "dbbcc6b57c9c"}, {Key: "vcs.modified", Value: "true"}},
			}, "v0.0.0-20261129113914-dbbcc6b57c9c+dirty, revision dbbcc6b57c9c (modified), go1.26.0"},
		}
		for _, tt := range tests {
			if got := versionOf(tt.bi, "go1.26.0"); got != tt.want {
				t.Errorf("%s: versionOf = %q, want %q", tt.name, got, tt.want)
			}
		}
	})
}
