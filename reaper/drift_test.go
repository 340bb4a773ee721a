package reaper_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/jobreaper/jobreaper/internal/asynqstate"
	"github.com/jobreaper/jobreaper/internal/pgstore"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
	"github.com/jobreaper/jobreaper/reaper"
)

// daemonSettings are the settings of a daemon of queues with the CASES
// baseline (1-minute interval, 5-minute heartbeat, 15-minute stall
// timeout), reading redisURL, with the defaults of the other settings.
func daemonSettings(t *testing.T, queues []string, redisURL string) reaper.Settings {
	t.Helper()
	s := reaper.NewSettings(time.Minute, 5*time.Minute, 15*time.Minute, queues, nil)
	id, err := asynqstate.RedisID(redisURL)
	if err != nil {
		t.Fatal(err)
	}
	s.Redis = id
	s.MaxLostPerPass = 100
	s.StaleQueuedAfter = time.Hour.String()
	s.StaleQueuedLookupsPerPass = 1000
	s.CancelOnReap = true
	s.OutageGrace = true
	s.MaxStalledPerPass = 100
	s.MaxStalledFraction = 0.5
	s.StallStormHold = time.Duration(0).String()
	return s
}

// TestCase_B31_AReplicaReadingAnotherRedisDatabaseReportsDrift: the
// leader reads Redis database 9, where the queues live; a replica was
// deployed with database 8. A leader pointed at the wrong database sees
// no active task and holds every lost job, so the difference is drift:
// the replica logs it, naming the Redis of each as topology and
// host:port/db, never a password, and sets jobreaper_settings_drift.
func TestCase_B31_AReplicaReadingAnotherRedisDatabaseReportsDrift(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := jobstest.New(t)
	queues := []string{"reports"}
	leader := newLeaseReplica(t, db.Daemon(), queues, daemonSettings(t, queues, "redis://:s3cret@127.0.0.1:6379/9"))
	other := newLeaseReplica(t, db.Daemon(), queues, daemonSettings(t, queues, "redis://:0th3r@127.0.0.1:6379/8"))
	same := newLeaseReplica(t, db.Daemon(), queues, daemonSettings(t, queues, "rediss://127.0.0.1:6379/9"))
	if !leader.lease.Attempt(ctx) || other.lease.Attempt(ctx) || same.lease.Attempt(ctx) {
		t.Fatal("want the first replica to lead and the others to follow")
	}
	drift := func(r leaseReplica) float64 {
		return metricValue(t, r.reg, "jobreaper_settings_drift", map[string]string{})
	}
	if drift(other) != 1 || drift(same) != 0 || drift(leader) != 0 {
		t.Fatalf("jobreaper_settings_drift: other database %v, same Redis %v, leader %v; want 1, 0, 0", drift(other), drift(same), drift(leader))
	}
	logged := strings.Join(other.log.take(), "\n")
	if !strings.Contains(logged, "level=ERROR") ||
		!strings.Contains(logged, "redis: this replica single 127.0.0.1:6379/8, the leader single 127.0.0.1:6379/9") {
		t.Fatalf("the replica on database 8 does not name both Redis:\n%s", logged)
	}
	if sameLog := strings.Join(same.log.take(), "\n"); strings.Contains(sameLog, "settings drift") {
		t.Fatalf("a replica reading the leader's Redis over TLS, without the password, reported drift:\n%s", sameLog)
	}
	var recorded string
	if err := db.Pool.QueryRow(ctx, `SELECT settings::text FROM `+db.Table("leader_leases")).Scan(&recorded); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(recorded, "single 127.0.0.1:6379/9") || strings.Contains(recorded+logged, "s3cret") || strings.Contains(recorded+logged, "0th3r") {
		t.Fatalf("the leader's recorded settings %s or the log show a password, or lack the Redis", recorded)
	}
}

// TestCase_B31_EverySettingThatDecidesWhatTheLeaderDoesIsCompared: a
// replica that differs from the leader in one of max_lost_per_pass,
// stale_queued_after, stale_queued_lookups_per_pass, cancel on reap or the
// outage grace reports drift naming that setting and both values.
func TestCase_B31_EverySettingThatDecidesWhatTheLeaderDoesIsCompared(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := jobstest.New(t)
	queues := []string{"reports"}
	const redisURL = "redis://127.0.0.1:6379/9"
	leader := newLeaseReplica(t, db.Daemon(), queues, daemonSettings(t, queues, redisURL))
	if !leader.lease.Attempt(ctx) {
		t.Fatal("the leader did not take the leader lease")
	}
	for _, c := range []struct {
		change func(*reaper.Settings)
		want   string
	}{
		{func(s *reaper.Settings) { s.MaxLostPerPass = 0 }, "max_lost_per_pass: this replica 0, the leader 100"},
		{func(s *reaper.Settings) { s.StaleQueuedAfter = (2 * time.Hour).String() }, "stale_queued_after: this replica 2h0m0s, the leader 1h0m0s"},
		{func(s *reaper.Settings) { s.StaleQueuedLookupsPerPass = 50 }, "stale_queued_lookups_per_pass: this replica 50, the leader 1000"},
		{func(s *reaper.Settings) { s.CancelOnReap = false }, "cancel_on_reap: this replica false, the leader true"},
		{func(s *reaper.Settings) { s.OutageGrace = false }, "outage_grace: this replica false, the leader true"},
		{func(s *reaper.Settings) { s.HeartbeatInterval = (2 * time.Minute).String() }, "heartbeat_interval: this replica 2m0s, the leader 5m0s"},
	} {
		settings := daemonSettings(t, queues, redisURL)
		c.change(&settings)
		r := newLeaseReplica(t, db.Daemon(), queues, settings)
		if r.lease.Attempt(ctx) {
			t.Fatal("a follower took the leader lease")
		}
		if v := metricValue(t, r.reg, "jobreaper_settings_drift", map[string]string{}); v != 1 {
			t.Errorf("%s: jobreaper_settings_drift = %v, want 1", c.want, v)
		}
		lines := r.log.take()
		if countLines(lines, "level=ERROR", "settings drift") != 1 || countLines(lines, c.want) != 1 {
			t.Errorf("the log does not name %q once:\n%s", c.want, strings.Join(lines, "\n"))
		}
	}
}

// recordedBeforeTheRedisSetting is a leader lease row's settings as the
// version before the Redis, max_lost_per_pass, stale QUEUED and cancel on
// reap settings recorded them (a 1-minute interval, 5-minute heartbeat,
// 15-minute stall timeout, no cascade).
const recordedBeforeTheRedisSetting = `{"interval": "1m0s", "heartbeat_interval": "5m0s", "stall_timeout": "15m0s", "queues": ["reports"], "cascades": "44136fa355b3678a"}`

// TestCase_B31_ALeaderOfAnOlderVersionRecordsFewerSettings: during a
// rolling upgrade the leader still runs the version that recorded five
// settings. The settings its record lacks are unknown, not differences: a
// replica that agrees on the five reports no drift (and says once which
// settings it cannot compare), one that differs in one of them reports
// just that one.
func TestCase_B31_ALeaderOfAnOlderVersionRecordsFewerSettings(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := jobstest.New(t)
	store := db.Daemon()
	queues := []string{"reports"}
	if got := reaper.CascadesDigest(nil); got != "44136fa355b3678a" {
		t.Fatalf("the digest of no cascade changed to %s: replicas of two versions would always drift", got)
	}
	old, err := store.AcquireLeaderLease(ctx, pgstore.LeaderLeaseParams{Key: pgstore.LeaderLeaseKey(queues),
		Holder: pgstore.NewLeaderLeaseHolder(time.Now()), TTL: time.Hour, Settings: json.RawMessage(recordedBeforeTheRedisSetting)})
	if err != nil || !old.Held {
		t.Fatalf("the older leader's attempt = %+v, %v", old, err)
	}

	agrees := newLeaseReplica(t, store, queues, daemonSettings(t, queues, "redis://127.0.0.1:6379/9"))
	for range 3 {
		agrees.lease.Attempt(ctx)
	}
	if v := metricValue(t, agrees.reg, "jobreaper_settings_drift", map[string]string{}); v != 0 {
		t.Fatalf("a replica agreeing on every recorded setting: jobreaper_settings_drift = %v, want 0", v)
	}
	lines := agrees.log.take()
	if n := countLines(lines, "level=ERROR"); n != 0 {
		t.Fatalf("a replica agreeing on every recorded setting logged %d errors:\n%s", n, strings.Join(lines, "\n"))
	}
	if countLines(lines, "level=INFO", "older version", "redis", "max_lost_per_pass", "stale_queued_after",
		"stale_queued_lookups_per_pass", "cancel_on_reap") != 1 {
		t.Fatalf("the settings the leader does not record are not named once:\n%s", strings.Join(lines, "\n"))
	}

	slower := daemonSettings(t, queues, "redis://127.0.0.1:6379/9")
	slower.DefaultStallTimeout = time.Hour.String()
	differs := newLeaseReplica(t, store, queues, slower)
	differs.lease.Attempt(ctx)
	if v := metricValue(t, differs.reg, "jobreaper_settings_drift", map[string]string{}); v != 1 {
		t.Fatalf("a replica with another stall timeout: jobreaper_settings_drift = %v, want 1", v)
	}
	lines = differs.log.take()
	if countLines(lines, "level=ERROR", "differences=\"[stall_timeout: this replica 1h0m0s, the leader 15m0s]\"") != 1 {
		t.Fatalf("the drift is not stall_timeout alone:\n%s", strings.Join(lines, "\n"))
	}
}

// A drift is logged when it appears, when its differences change, and
// every ten minutes while it lasts, not at every attempt;
// jobreaper_settings_drift stays 1 throughout, and a resolution is said
// once.
func TestSettingsDriftIsLoggedOncePerChange(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := jobstest.New(t)
	store := db.Daemon()
	queues := []string{"reports"}
	const redisURL = "redis://127.0.0.1:6379/9"
	leaderSettings := daemonSettings(t, queues, redisURL)
	leader := newLeaseReplica(t, store, queues, leaderSettings)
	if !leader.lease.Attempt(ctx) {
		t.Fatal("the leader did not take the leader lease")
	}
	mine := daemonSettings(t, queues, redisURL)
	mine.MaxLostPerPass = 10
	r := newLeaseReplica(t, store, queues, mine)
	now := time.Now()
	reaper.SetLeaderLeaseClock(r.lease, func() time.Time { return now })
	attempts := func(n int) []string {
		t.Helper()
		for range n {
			if r.lease.Attempt(ctx) {
				t.Fatal("the follower took the leader lease")
			}
			if v := metricValue(t, r.reg, "jobreaper_settings_drift", map[string]string{}); v != 1 {
				t.Fatalf("jobreaper_settings_drift = %v during the drift, want 1", v)
			}
		}
		return r.log.take()
	}
	const drift = "settings drift: "
	if lines := attempts(5); countLines(lines, "level=ERROR", drift, "max_lost_per_pass: this replica 10, the leader 100") != 1 {
		t.Fatalf("five attempts into a drift, want it logged once:\n%s", strings.Join(lines, "\n"))
	}
	now = now.Add(reaper.DriftLogRepeat - time.Second)
	if lines := attempts(3); countLines(lines, drift) != 0 {
		t.Fatalf("the drift was logged again before ten minutes:\n%s", strings.Join(lines, "\n"))
	}
	now = now.Add(time.Second)
	if lines := attempts(3); countLines(lines, "level=ERROR", drift) != 1 {
		t.Fatalf("ten minutes on, want the lasting drift logged once more:\n%s", strings.Join(lines, "\n"))
	}

	// Another leader, whose settings differ from this replica's in one
	// more setting: logged at once.
	if err := store.ReleaseLeaderLease(ctx, leader.lease.Key(), leader.lease.Holder().ID); err != nil {
		t.Fatal(err)
	}
	otherSettings := daemonSettings(t, queues, redisURL)
	otherSettings.CancelOnReap = false
	other := newLeaseReplica(t, store, queues, otherSettings)
	if !other.lease.Attempt(ctx) {
		t.Fatal("the second leader did not take the released leader lease")
	}
	if lines := attempts(3); countLines(lines, "level=ERROR", drift, "max_lost_per_pass", "cancel_on_reap: this replica true, the leader false") != 1 {
		t.Fatalf("a changed difference, want it logged once at once:\n%s", strings.Join(lines, "\n"))
	}

	// A leader with this replica's settings: resolved, said once.
	if err := store.ReleaseLeaderLease(ctx, other.lease.Key(), other.lease.Holder().ID); err != nil {
		t.Fatal(err)
	}
	twin := newLeaseReplica(t, store, queues, mine)
	if !twin.lease.Attempt(ctx) {
		t.Fatal("the third leader did not take the released leader lease")
	}
	for range 3 {
		r.lease.Attempt(ctx)
	}
	if v := metricValue(t, r.reg, "jobreaper_settings_drift", map[string]string{}); v != 0 {
		t.Fatalf("jobreaper_settings_drift = %v once the settings agree, want 0", v)
	}
	if lines := r.log.take(); countLines(lines, "settings drift resolved") != 1 || countLines(lines, "level=ERROR") != 0 {
		t.Fatalf("want the resolution said once and no error:\n%s", strings.Join(lines, "\n"))
	}
}

// Compare names each setting that differs, with both values, in the
// order of Settings' fields; settings the record lacks are unknown;
// settings only the record holds and the row's jsonb formatting are
// ignored; a record that is not a JSON object is an error.
func TestSettingsCompare(t *testing.T) {
	t.Parallel()
	mine := reaper.Settings{Interval: "1m0s", HeartbeatInterval: "5m0s", DefaultStallTimeout: "15m0s",
		Queues: []string{"a", "b"}, Cascades: "44136fa355b3678a", Redis: "single 127.0.0.1:6379/9",
		MaxLostPerPass: 100, StaleQueuedAfter: "1h0m0s", StaleQueuedLookupsPerPass: 1000, CancelOnReap: true, OutageGrace: true,
		MaxStalledPerPass: 100, MaxStalledFraction: 0.5, StallStormHold: "0s"}
	own, err := json.Marshal(mine)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name, recorded string
		diffs          []string
		unknown        []string
	}{
		{"the same", string(own), nil, nil},
		{"as jsonb prints it, with a setting of a newer version",
			`{"interval": "1m0s", "heartbeat_interval": "5m0s", "stall_timeout": "15m0s", "queues": ["a", "b"], "cascades": "44136fa355b3678a",
			  "redis": "single 127.0.0.1:6379/9", "max_lost_per_pass": 100, "stale_queued_after": "1h0m0s",
			  "stale_queued_lookups_per_pass": 1000, "cancel_on_reap": true, "max_stalled_per_pass": 100,
			  "max_stalled_fraction": 0.50, "stall_storm_hold": "0s", "outage_grace": true, "future_setting": 7}`, nil, nil},
		{"every setting different",
			`{"interval": "2m0s", "heartbeat_interval": "1m0s", "stall_timeout": "1h0m0s", "queues": ["a"], "cascades": "0000000000000000",
			  "redis": "sentinel mymaster/9", "max_lost_per_pass": 0, "stale_queued_after": "2h0m0s",
			  "stale_queued_lookups_per_pass": 10, "cancel_on_reap": false, "max_stalled_per_pass": 0,
			  "max_stalled_fraction": 0.25, "stall_storm_hold": "10m0s", "outage_grace": false}`,
			[]string{
				"interval: this replica 1m0s, the leader 2m0s",
				"heartbeat_interval: this replica 5m0s, the leader 1m0s",
				"stall_timeout: this replica 15m0s, the leader 1h0m0s",
				`queues: this replica ["a","b"], the leader ["a"]`,
				"cascades: this replica 44136fa355b3678a, the leader 0000000000000000",
				"redis: this replica single 127.0.0.1:6379/9, the leader sentinel mymaster/9",
				"max_lost_per_pass: this replica 100, the leader 0",
				"stale_queued_after: this replica 1h0m0s, the leader 2h0m0s",
				"stale_queued_lookups_per_pass: this replica 1000, the leader 10",
				"cancel_on_reap: this replica true, the leader false",
				"outage_grace: this replica true, the leader false",
				"max_stalled_per_pass: this replica 100, the leader 0",
				"max_stalled_fraction: this replica 0.5, the leader 0.25",
				"stall_storm_hold: this replica 0s, the leader 10m0s",
			}, nil},
		{"an older leader's record", recordedBeforeTheRedisSetting,
			[]string{`queues: this replica ["a","b"], the leader ["reports"]`},
			[]string{"redis", "max_lost_per_pass", "stale_queued_after", "stale_queued_lookups_per_pass", "cancel_on_reap",
				"outage_grace", "max_stalled_per_pass", "max_stalled_fraction", "stall_storm_hold"}},
		{"an empty record", `{}`, nil,
			[]string{"interval", "heartbeat_interval", "stall_timeout", "queues", "cascades", "redis", "max_lost_per_pass",
				"stale_queued_after", "stale_queued_lookups_per_pass", "cancel_on_reap", "outage_grace",
				"max_stalled_per_pass", "max_stalled_fraction", "stall_storm_hold"}},
		{"a value of another JSON type", strings.Replace(string(own), `"max_lost_per_pass":100`, `"max_lost_per_pass":"100"`, 1),
			[]string{`max_lost_per_pass: this replica 100, the leader "100"`}, nil},
	} {
		diffs, unknown, err := mine.Compare(json.RawMessage(c.recorded))
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		var got []string
		for _, d := range diffs {
			got = append(got, d.String())
		}
		if strings.Join(got, "\n") != strings.Join(c.diffs, "\n") || strings.Join(unknown, ",") != strings.Join(c.unknown, ",") {
			t.Errorf("%s: differences\n  %s\nunknown %v; want\n  %s\nunknown %v", c.name,
				strings.Join(got, "\n  "), unknown, strings.Join(c.diffs, "\n  "), c.unknown)
		}
	}
	for _, bad := range []string{`[]`, `null`, `"x"`, `{`} {
		if _, _, err := mine.Compare(json.RawMessage(bad)); err == nil {
			t.Errorf("Compare(%s) = nil error, want one saying it is not a JSON object", bad)
		}
	}
}
