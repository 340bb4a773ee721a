package jobs_test

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/jobreaper/jobreaper/internal/pgcore"
	"github.com/jobreaper/jobreaper/jobs"
)

func TestIntervalDuration(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		iv   pgtype.Interval
		want time.Duration
	}{
		{"MicrosecondsOnly", pgtype.Interval{Microseconds: 90_000_000}, 90 * time.Second},
		{"DaysAreTwentyFourHours", pgtype.Interval{Days: 2, Microseconds: 1}, 48*time.Hour + time.Microsecond},
		{"MonthsAreThirtyDays", pgtype.Interval{Months: 1}, 30 * 24 * time.Hour},
		{"FiveHundredYearsSaturate", pgtype.Interval{Months: 500 * 12}, jobs.MaxDuration},
		{"HugeMicrosecondsSaturate", pgtype.Interval{Microseconds: 1 << 62}, jobs.MaxDuration},
		{"NegativeHugeSaturates", pgtype.Interval{Months: -500 * 12}, -jobs.MaxDuration},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := pgcore.IntervalDuration(tc.iv); got != tc.want {
				t.Fatalf("IntervalDuration(%+v) = %v, want %v", tc.iv, got, tc.want)
			}
		})
	}
}
