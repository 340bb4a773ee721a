package limits

import (
	"strings"
	"testing"
	"time"
)

func TestSuggest(t *testing.T) {
	t.Parallel()
	base := Input{Type: "encode", Table: `"public"."job_types"`, Attempts: 100,
		HeartbeatInterval: 5 * time.Minute, MinStallTimeout: 11 * time.Minute,
		MaxRuntime: time.Hour, StallTimeout: 15 * time.Minute, HardTimeout: 24 * time.Hour}
	cases := []struct {
		name          string
		edit          func(*Input)
		enough        bool
		maxRT, stall  time.Duration
		hard          time.Duration
		sql, noteHave string
	}{
		{name: "NotEnoughDataBelow100Attempts", edit: func(in *Input) { in.Attempts = 99; in.RuntimeP99 = time.Hour },
			noteHave: "not enough data: 99 finished attempt(s)"},
		{name: "RuntimeScaledAndRoundedUpToAMinute", edit: func(in *Input) { in.RuntimeP99 = 40 * time.Minute; in.GapP99 = 10 * time.Minute },
			// 1.25 x 40m = 50m (above 40m + 5m); 2 x 10m = 20m.
			enough: true, maxRT: 50 * time.Minute, stall: 20 * time.Minute,
			sql: `UPDATE "public"."job_types" SET max_runtime = interval '50 minutes', stall_timeout = interval '20 minutes' WHERE name = 'encode';`},
		{name: "RoundsUpASecondOverAMinute", edit: func(in *Input) {
			in.RuntimeP99 = 48*time.Minute + 1*time.Second
			in.GapP99 = 6*time.Minute + time.Second
		},
			// 1.25 x 48m01s = 60m01.25s -> 61m; 2 x 6m01s = 12m02s -> 13m.
			enough: true, maxRT: 61 * time.Minute, stall: 13 * time.Minute},
		{name: "AtLeastP99PlusOneHeartbeat", edit: func(in *Input) { in.RuntimeP99 = 8 * time.Minute; in.GapP99 = 7 * time.Minute },
			// 1.25 x 8m = 10m < 8m + 5m = 13m.
			enough: true, maxRT: 13 * time.Minute, stall: 14 * time.Minute},
		{name: "StallTimeoutNeverBelowTheRuleMinimum", edit: func(in *Input) { in.RuntimeP99 = 40 * time.Minute; in.GapP99 = 30 * time.Second },
			// 2 x 30s = 1m < 11m.
			enough: true, maxRT: 50 * time.Minute, stall: 11 * time.Minute},
		{name: "HardTimeoutSuggestedWhenTheRuleWouldBreak", edit: func(in *Input) {
			in.RuntimeP99 = 40 * time.Minute
			in.GapP99 = 10 * time.Minute
			in.HardTimeout = 70 * time.Minute
		},
			// 50m + 20m = 70m is not below 70m: hard = 50m + 2 x 20m = 90m.
			enough: true, maxRT: 50 * time.Minute, stall: 20 * time.Minute, hard: 90 * time.Minute,
			sql:      `UPDATE "public"."job_types" SET max_runtime = interval '50 minutes', stall_timeout = interval '20 minutes', hard_timeout = interval '90 minutes' WHERE name = 'encode';`,
			noteHave: "applies to newly enqueued tasks only"},
		{name: "NoHardTimeoutWhenTheRuleHolds", edit: func(in *Input) {
			in.RuntimeP99 = 40 * time.Minute
			in.GapP99 = 10 * time.Minute
			in.HardTimeout = 71 * time.Minute
		}, enough: true, maxRT: 50 * time.Minute, stall: 20 * time.Minute},
		{name: "QuotesTheTypeName", edit: func(in *Input) { in.Type = "it's"; in.RuntimeP99 = 40 * time.Minute },
			enough: true, maxRT: 50 * time.Minute, stall: 11 * time.Minute,
			sql: `UPDATE "public"."job_types" SET max_runtime = interval '50 minutes', stall_timeout = interval '11 minutes' WHERE name = 'it''s';`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			in := base
			c.edit(&in)
			s := Suggest(in)
			if s.Enough != c.enough || s.MaxRuntime != c.maxRT || s.StallTimeout != c.stall || s.HardTimeout != c.hard {
				t.Fatalf("Suggest = %+v, want enough %v, max_runtime %s, stall %s, hard %s", s, c.enough, c.maxRT, c.stall, c.hard)
			}
			if c.sql != "" && s.SQL != c.sql {
				t.Fatalf("SQL = %s\nwant  %s", s.SQL, c.sql)
			}
			if !c.enough && s.SQL != "" {
				t.Fatalf("SQL = %q with not enough data, want none", s.SQL)
			}
			if !strings.Contains(s.Note, c.noteHave) || (c.noteHave == "" && s.Note != "") {
				t.Fatalf("Note = %q, want it to hold %q", s.Note, c.noteHave)
			}
		})
	}
}

func TestCeilMinuteAndInterval(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		in, want time.Duration
	}{{0, 0}, {-time.Second, 0}, {time.Nanosecond, time.Minute}, {time.Minute, time.Minute}, {61 * time.Second, 2 * time.Minute}} {
		if got := CeilMinute(c.in); got != c.want {
			t.Errorf("CeilMinute(%s) = %s, want %s", c.in, got, c.want)
		}
	}
	if got := Interval(11*time.Minute + 30*time.Second); got != "interval '690 seconds'" {
		t.Errorf("Interval(11m30s) = %s", got)
	}
	if got := Interval(2 * time.Hour); got != "interval '120 minutes'" {
		t.Errorf("Interval(2h) = %s", got)
	}
}
