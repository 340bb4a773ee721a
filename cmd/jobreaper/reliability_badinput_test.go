package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
	"github.com/jobreaper/jobreaper/queue"
)

// badInputSecret is a password the bad URLs carry; no output may show it.
const badInputSecret = "S3cretPw0rd"

// badCLICase is one bad command line: the exit code it must end with and
// the fragments its one line on stderr must hold (naming the setting, the
// flag or the job).
type badCLICase struct {
	name  string
	args  func(db *jobstest.DB, dir string) []string
	code  int
	frags []string
}

// onDB returns args after the database, schema and Redis flags of db.
func onDB(args ...string) func(db *jobstest.DB, dir string) []string {
	return func(db *jobstest.DB, _ string) []string {
		cmd := args[:1]
		if args[0] == "run" {
			cmd = []string{"run", "--once"}
		}
		rest := args[1:]
		return append(append(cmd, "--database-url", db.URL, "--schema", db.Schema, "--redis-url", redisTestURL()), rest...)
	}
}

// withFile writes content as the config file and runs run --once with it.
func withFile(content string) func(db *jobstest.DB, dir string) []string {
	return func(db *jobstest.DB, dir string) []string {
		path := filepath.Join(dir, "jobreaper.yaml")
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			panic(err)
		}
		return []string{"run", "--once", "--config", path, "--database-url", db.URL, "--schema", db.Schema, "--redis-url", redisTestURL()}
	}
}

var badCLICases = []badCLICase{
	// Malformed config files.
	{"FileThatIsNotYAML", withFile("schema: jr\nqueues: [a, b\n"), exitCannotRun, []string{"is not valid YAML: line 2"}},
	{"FileWhoseTopLevelIsAList", withFile("- interval: 1m\n"), exitCannotRun, []string{"the top level must be a mapping"}},
	{"FileOfBinaryGarbage", withFile("\x00\xff\xfe\x01"), exitCannotRun, []string{"is not valid YAML"}},
	{"FileWithAMisspeltKey", withFile("stal_timeout: 20m\n"), exitCannotRun, []string{`unknown key "stal_timeout" (did you mean "stall_timeout"?)`}},
	{"FileWithAValueOfTheWrongType", withFile("page_size: lots\n"), exitCannotRun, []string{`page_size: "lots" is not a whole number`, "line 1 key page_size"}},
	{"FileWithADurationWithoutUnit", withFile("stall_timeout: 900\n"), exitCannotRun, []string{"stall_timeout: 900 is not a duration"}},
	{"FileWithAKeyWithoutValue", withFile("interval:\n"), exitCannotRun, []string{"interval has no value"}},
	{"FileThatIsADirectory", func(db *jobstest.DB, dir string) []string {
		return []string{"run", "--once", "--config", dir, "--database-url", db.URL}
	}, exitCannotRun, []string{"is a directory"}},
	{"FileThatDoesNotExist", func(db *jobstest.DB, dir string) []string {
		return []string{"run", "--once", "--config", filepath.Join(dir, "nope.yaml"), "--database-url", db.URL}
	}, exitCannotRun, []string{"does not exist"}},
	{"CascadeThatEndsTheTransaction", withFile("cascades:\n  report.export:\n    on_failed: [ROLLBACK]\n"), exitCannotRun,
		[]string{`cascade on_failed of type "report.export", statement 1`, "PREPARE"}},
	{"CascadeWithAnUnknownArgument", withFile("cascades:\n  report.export:\n    on_failed: [\"UPDATE p SET n = 1 WHERE id = @parent\"]\n"), exitCannotRun,
		[]string{"uses @parent"}},

	// Malformed flags and limits at zero, negative, too small or absurdly large.
	{"UnknownFlag", onDB("run", "--no-such-flag"), exitCannotRun, []string{"unknown flag: --no-such-flag"}},
	{"DurationWithoutUnit", onDB("run", "--interval", "60"), exitCannotRun, []string{"--interval", `"60"`}},
	{"DurationInWords", onDB("run", "--interval", "5 minutes"), exitCannotRun, []string{"--interval", `"5 minutes"`}},
	{"DurationPastTheLongest", onDB("run", "--interval", "9999999999h"), exitCannotRun, []string{"--interval"}},
	{"IntervalZero", onDB("run", "--interval", "0s"), exitCannotRun, []string{"interval 0s must be positive", "--interval"}},
	{"IntervalNegative", onDB("run", "--interval", "-1m"), exitCannotRun, []string{"interval -1m0s must be positive"}},
	{"StallTimeoutTooSmall", onDB("run", "--stall-timeout", "5m"), exitCannotRun, []string{"stall_timeout 5m0s is below 2 x heartbeat_interval"}},
	{"HeartbeatIntervalAbsurdlyLarge", onDB("run", "--heartbeat-interval", "1562500h"), exitCannotRun,
		[]string{"stall_timeout 15m0s is below 2 x heartbeat_interval (1562500h0m0s)", "longer than the longest duration"}},
	{"OpTimeoutZero", onDB("run", "--op-timeout", "0s"), exitCannotRun, []string{"op_timeout 0s must be positive"}},
	{"PageSizeZero", onDB("run", "--page-size", "0"), exitCannotRun, []string{"page_size 0 is below the minimum 1000"}},
	{"PageSizeNegative", onDB("run", "--page-size", "-5"), exitCannotRun, []string{"page_size -5 is below the minimum 1000"}},
	{"PageSizeTooSmall", onDB("run", "--page-size", "10"), exitCannotRun, []string{"page_size 10 is below the minimum 1000"}},
	{"PageSizeAbsurdlyLarge", onDB("run", "--page-size", "99999999999999999999"), exitCannotRun, []string{"--page-size"}},
	{"MaxLostPerPassNegative", onDB("run", "--max-lost-per-pass", "-1"), exitCannotRun, []string{"max_lost_per_pass -1 is negative"}},
	{"MaxStalledPerPassNegative", onDB("run", "--max-stalled-per-pass", "-1"), exitCannotRun, []string{"max_stalled_per_pass -1 is negative", "--max-stalled-per-pass"}},
	{"MaxStalledFractionAboveOne", onDB("run", "--max-stalled-fraction", "1.5"), exitCannotRun, []string{"max_stalled_fraction 1.5 is not between 0 and 1", "--max-stalled-fraction"}},
	{"MaxStalledFractionNaN", onDB("run", "--max-stalled-fraction", "NaN"), exitCannotRun, []string{"max_stalled_fraction", "is not a finite number"}},
	{"MaxStalledFractionNotANumber", onDB("run", "--max-stalled-fraction", "half"), exitCannotRun, []string{"--max-stalled-fraction"}},
	{"StallStormHoldNegative", onDB("run", "--stall-storm-hold", "-1m"), exitCannotRun, []string{"stall_storm_hold -1m0s is negative"}},
	{"StaleQueuedLookupsZero", onDB("run", "--stale-queued-lookups-per-pass", "0"), exitCannotRun, []string{"stale_queued_lookups_per_pass 0 is below 1"}},
	{"OutageGraceNotABoolean", onDB("run", "--outage-grace=sometimes"), exitCannotRun, []string{"--outage-grace"}},
	// The daemon's rule only: run --once never reads the window.
	{"MarkerWindowBelowIntervalForTheDaemon", func(db *jobstest.DB, _ string) []string {
		return []string{"run", "--database-url", db.URL, "--schema", db.Schema, "--redis-url", redisTestURL(), "--marker-check-window", "1s"}
	}, exitCannotRun, []string{"marker_check_window 1s is below interval"}},
	{"StartJitterNegative", onDB("run", "--start-jitter", "-1s"), exitCannotRun, []string{"start_jitter -1s is negative"}},
	{"SchemaThatIsNotAnIdentifier", func(db *jobstest.DB, _ string) []string {
		return []string{"run", "--once", "--database-url", db.URL, "--schema", `x"; DROP SCHEMA public; --`}
	}, exitCannotRun, []string{"is not a plain PostgreSQL identifier"}},
	// A comma-separated list is trimmed whatever its source: " a, a" is a
	// listed twice.
	{"QueueListedTwiceAfterTrimming", onDB("run", "--queues", " a, a"), exitCannotRun, []string{`queues item 2 "a" is listed twice`}},
	{"QueueListedTwice", onDB("run", "--queues", "a,a"), exitCannotRun, []string{`queues item 2 "a" is listed twice`}},
	{"EmptyQueueName", onDB("run", "--queues", "a,,b"), exitCannotRun, []string{"queues item 2 is empty"}},
	{"UnknownLister", onDB("run", "--lister", "raw"), exitCannotRun, []string{`lister "raw" is not a lister`}},
	{"MetricsAddressWithoutPort", onDB("run", "--metrics-addr", "localhost"), exitCannotRun, []string{`metrics_addr "localhost" is not host:port`}},
	{"UnknownOutput", onDB("run", "--output", "xml"), exitCannotRun, []string{`--output "xml"`}},

	// Malformed URLs; none may show its password.
	{"DatabaseURLWithoutScheme", func(*jobstest.DB, string) []string {
		return []string{"run", "--once", "--database-url", "u:" + badInputSecret + "@db.internal:5432/app"}
	}, exitCannotRun, []string{"database_url", "has no scheme"}},
	{"DatabaseURLWithABadPort", func(*jobstest.DB, string) []string {
		return []string{"run", "--once", "--database-url", "postgres://u:" + badInputSecret + "@db:notaport/app"}
	}, exitCannotRun, []string{"database_url", "is not a valid PostgreSQL connection URL"}},
	{"DatabaseURLWithABadTLSKeyPassword", func(*jobstest.DB, string) []string {
		return []string{"run", "--once", "--database-url", "postgres://u@db/app?sslmode=sometimes&sslpassword=" + badInputSecret}
	}, exitCannotRun, []string{"database_url", "sslpassword=xxxxx"}},
	{"DatabaseURLKeywordString", func(*jobstest.DB, string) []string {
		return []string{"run", "--once", "--database-url", "host=db password=" + badInputSecret + " port=notaport"}
	}, exitCannotRun, []string{"database_url", "not shown"}},
	{"RedisURLWithoutScheme", onDB("run", "--redis-url", ":"+badInputSecret+"@cache:6379/0"), exitCannotRun, []string{"redis_url", "has no scheme"}},
	{"RedisURLOfAnotherScheme", onDB("run", "--redis-url", "http://cache:6379"), exitCannotRun, []string{"redis_url", "invalid URL scheme"}},
	{"RedisURLWithABadDatabase", onDB("run", "--redis-url", "redis://:"+badInputSecret+"@cache:6379/x"), exitCannotRun,
		[]string{"redis_url redis://:xxxxx@cache:6379/x is not a valid Redis URL"}},
	{"RedisURLWithAPasswordParameter", onDB("run", "--redis-url", "redis://cache:6379/0?password="+badInputSecret), exitCannotRun,
		[]string{"redis_url", "carries a password as a query parameter"}},
	{"RedisURLWithASentinelPassword", onDB("run", "--redis-url", "redis://:"+badInputSecret+"@s1:26379?master_name=m&sentinel_password="+badInputSecret), exitCannotRun,
		[]string{"redis_url", "sentinel_password=xxxxx"}},

	// Operator commands given job IDs no row can have, or that match no row.
	{"InspectEmptyID", onDB("inspect", ""), exitPassErrors, []string{`job "" is outside what jobreaper reads or acts on`}},
	{"InspectNulByte", onDB("inspect", "J\x00"), exitPassErrors, []string{`"J\x00" is outside what jobreaper reads or acts on`}},
	{"InspectOverTheLengthLimit", onDB("inspect", strings.Repeat("j", jobs.MaxIDLength+1)), exitPassErrors, []string{"is outside what jobreaper reads or acts on", "over the limit of 1024"}},
	{"InspectOddIDMatchingNoRow", onDB("inspect", `it's "quoted" {x}`), exitPassErrors, []string{`job "it's \"quoted\" {x}" not found`}},
	{"InspectNonASCIIMatchingNoRow", onDB("inspect", "rapport-été-日本"), exitPassErrors, []string{`job "rapport-été-日本" not found`}},
	{"CancelWithoutReason", onDB("cancel", "J-stalled"), exitCannotRun, []string{"cancel needs --reason"}},
	{"CancelNulByte", onDB("cancel", "--reason", "test", "J\x00"), exitPassErrors, []string{`"J\x00"`, "nothing changed"}},
	{"CancelOddIDMatchingNoRow", onDB("cancel", "--reason", "test", "{braces} and spaces"), exitPassErrors, []string{`refused job "{braces} and spaces": no job has this ID`}},
	{"RequeueNulByte", onDB("requeue", "--reason", "test", "J\x00"), exitPassErrors, []string{`refused "J\x00": job ID "J\x00" contains a NUL byte`}},
	{"RequeueInvalidUTF8", onDB("requeue", "--reason", "test", "J\xff"), exitPassErrors, []string{`refused "J\xff": job ID "J\xff" is not valid UTF-8`}},
	{"RequeueIDWithANewline", onDB("requeue", "--reason", "test", "J\nrequeued J-stalled"), exitPassErrors, []string{`refused "J\nrequeued J-stalled": no job has this ID`}},
	{"RequeueOddIDMatchingNoRow", onDB("requeue", "--reason", "test", "'; DROP TABLE jobs; --"), exitPassErrors, []string{"'; DROP TABLE jobs; --"}},
	{"PruneNegativeAge", onDB("prune", "--older-than", "-24h"), exitCannotRun, []string{"--older-than"}},
	{"PruneAgeWithoutUnit", onDB("prune", "--older-than", "30"), exitCannotRun, []string{"--older-than"}},
}

// TestReliabilityBadInput_CLI runs the real command line, in process, with
// each malformed config file, flag, URL and job ID next to a schema holding
// one stalled job: each ends with its exit code (2 could not run, 1 the
// command refused the job) and one line on stderr naming the setting, flag
// or job; no output shows a password; the stalled job, its events and its
// marker are untouched (nothing ran).
func TestReliabilityBadInput_CLI(t *testing.T) {
	t.Parallel()
	tally := jobstest.NewBadInputs(t)
	db := jobstest.New(t)
	db.JobType(t, "report.export", "30 minutes", "", "")
	db.Insert(t, jobstest.Job{ID: "J-stalled", Type: "report.export", Generation: 1, Queue: "badinput",
		StartedAgo: jobstest.Ago(31 * time.Minute), IdleAgo: 21 * time.Minute})
	rc := realRedis(t)
	before := db.Read(t, "J-stalled")
	t.Cleanup(func() {
		if got := db.Read(t, "J-stalled"); got != before {
			t.Errorf("the stalled job changed: %+v -> %+v", before, got)
		}
		if n := db.Count(t, `SELECT count(*) FROM job_events`); n != 0 {
			t.Errorf("%d events written", n)
		}
		if n, err := rc.Exists(context.Background(), queue.MarkerKey("J-stalled")).Result(); err != nil || n != 0 {
			t.Errorf("marker of J-stalled: %d (%v), want none", n, err)
		}
	})
	for _, tc := range badCLICases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tally.Try(t)
			r := run(t, tc.args(db, t.TempDir())...)
			requireExit(t, r, tc.code)
			if strings.Count(r.stderr, "\n") != 1 || !strings.HasSuffix(r.stderr, "\n") {
				t.Errorf("stderr should be exactly one line, got %q", r.stderr)
			}
			for _, f := range tc.frags {
				if !strings.Contains(r.stderr+r.stdout, f) {
					t.Errorf("stderr %q and stdout %q lack %q", r.stderr, r.stdout, f)
				}
			}
			if strings.ContainsAny(r.stdout+r.stderr, "\x00\r") || !utf8.ValidString(r.stdout+r.stderr) {
				t.Errorf("output holds raw control bytes or invalid UTF-8: stdout %q stderr %q", r.stdout, r.stderr)
			}
			if strings.Contains(r.stdout+r.stderr, badInputSecret) {
				t.Errorf("the password shows: stdout %q stderr %q", r.stdout, r.stderr)
			}
		})
	}
}
