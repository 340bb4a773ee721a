package config

import (
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jobreaper/jobreaper/internal/pgstore"
)

// valid returns a Config that passes Validate, for tests to break one field.
func valid() Config {
	return Config{DatabaseURL: "postgres://jobreaper:pw@db:5432/app"}.WithDefaults()
}

// problems returns every *FieldError joined in err.
func problems(t *testing.T, err error) []*FieldError {
	t.Helper()
	if err == nil {
		return nil
	}
	var out []*FieldError
	var walk func(error)
	walk = func(e error) {
		var fe *FieldError
		if errors.As(e, &fe) && fe == e {
			out = append(out, fe)
			return
		}
		if j, ok := e.(interface{ Unwrap() []error }); ok {
			for _, x := range j.Unwrap() {
				walk(x)
			}
			return
		}
		t.Fatalf("error %q is not a *FieldError", e)
	}
	walk(err)
	return out
}

// requireProblem fails unless err holds exactly one problem, about key,
// whose message contains every fragment.
func requireProblem(t *testing.T, err error, key string, fragments ...string) {
	t.Helper()
	ps := problems(t, err)
	if len(ps) != 1 {
		t.Fatalf("want one problem about %s, got %d: %v", key, len(ps), err)
	}
	if ps[0].Key != key {
		t.Fatalf("problem names %q, want %q: %s", ps[0].Key, key, ps[0].Msg)
	}
	if !strings.Contains(ps[0].Msg, key) {
		t.Fatalf("message does not name %s: %s", key, ps[0].Msg)
	}
	for _, f := range fragments {
		if !strings.Contains(ps[0].Msg, f) {
			t.Errorf("message %q lacks %q", ps[0].Msg, f)
		}
	}
}

func TestWithDefaults(t *testing.T) {
	t.Parallel()

	t.Run("FillsEveryDefault", func(t *testing.T) {
		t.Parallel()
		got := Config{}.WithDefaults()
		want := Config{
			RedisURL:          "redis://127.0.0.1:6379/0",
			Schema:            "public",
			Interval:          time.Minute,
			StallTimeout:      15 * time.Minute,
			HeartbeatInterval: 5 * time.Minute,
			PageSize:          1000,
			Lister:            "ids",
			MetricsAddr:       "127.0.0.1:9468",
			StatusAddr:        "127.0.0.1:9469",
			LogLevel:          "info",
			LogFormat:         "text",
			StartJitter:       time.Second,
			OpTimeout:         10 * time.Second,

			StaleQueuedAfter:          time.Hour,
			StaleQueuedLookupsPerPass: 1000,
			MarkerCheckWindow:         time.Hour,
			MaxLostPerPass:            100,
			OutageGrace:               ptr(true),
			MaxStalledPerPass:         100,
			MaxStalledFraction:        0.5,
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("defaults:\n got %+v\nwant %+v", got, want)
		}
		if got.DatabaseURL != "" || got.Queues != nil || got.Cascades != nil {
			t.Fatalf("database_url, queues and cascades have no default: %+v", got)
		}
	})

	t.Run("KeepsSetValuesAndReturnsACopy", func(t *testing.T) {
		t.Parallel()
		in := Config{Interval: 2 * time.Minute, Queues: []string{"critical"}, LogFormat: "json"}
		got := in.WithDefaults()
		if got.Interval != 2*time.Minute || !slices.Equal(got.Queues, []string{"critical"}) || got.LogFormat != "json" {
			t.Fatalf("set values changed: %+v", got)
		}
		if in.StallTimeout != 0 || in.RedisURL != "" {
			t.Fatalf("WithDefaults changed its receiver: %+v", in)
		}
	})

	t.Run("DefaultsPassValidationOnceDatabaseURLIsSet", func(t *testing.T) {
		t.Parallel()
		if err := valid().Validate(); err != nil {
			t.Fatalf("defaults do not validate: %v", err)
		}
	})
}

func TestStallRule(t *testing.T) {
	t.Parallel()
	c := valid()
	c.StallTimeout, c.HeartbeatInterval, c.Interval = 20*time.Minute, 4*time.Minute, 2*time.Minute
	got := c.StallRule()
	want := pgstore.StallRule{
		DefaultStallTimeout: 20 * time.Minute,
		MinStallTimeout:     10 * time.Minute, // 2 x 4m + 2m
		DefaultHardTimeout:  24 * time.Hour,
	}
	if got != want {
		t.Fatalf("StallRule() = %+v, want %+v", got, want)
	}
}

func ptr[T any](v T) *T { return &v }
