package config

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jobreaper/jobreaper/internal/redact"
	"github.com/jobreaper/jobreaper/jobs"
)

// decode sets, on a Config holding the defaults, every setting raw holds.
func decode(raw map[string]any) (Config, []error) {
	cfg := Config{}.WithDefaults()
	v := reflect.ValueOf(&cfg).Elem()
	var errs []error
	for _, s := range settings {
		val, ok := raw[s.key]
		if !ok {
			continue
		}
		if err := setField(fieldOf(v, s.key), s, val); err != nil {
			errs = append(errs, err)
		}
	}
	if val, ok := raw[keyCascades]; ok {
		var cerrs []error
		cfg.Cascades, cerrs = decodeCascades(val)
		errs = append(errs, cerrs...)
	}
	return cfg, errs
}

func setField(f reflect.Value, s setting, val any) error {
	bad := func(rule string) error {
		return &FieldError{Key: s.key, Msg: fmt.Sprintf("%s: %s %s", s.key, display(s, val), rule)}
	}
	if val == nil {
		if f.Kind() == reflect.Slice {
			f.SetZero()
			return nil
		}
		return &FieldError{Key: s.key, Msg: fmt.Sprintf("%s has no value (remove the key to use the default)", s.key)}
	}
	switch f.Interface().(type) {
	case time.Duration:
		switch x := val.(type) {
		case time.Duration:
			f.SetInt(int64(x))
		case string:
			d, err := time.ParseDuration(strings.TrimSpace(x))
			if err != nil {
				return bad("is not a duration (use Go syntax such as 5m or 90s)")
			}
			f.SetInt(int64(d))
		default:
			return bad("is not a duration (use Go syntax such as 5m or 90s, with a unit)")
		}
	case bool:
		switch x := val.(type) {
		case bool:
			f.SetBool(x)
		case string:
			b, err := strconv.ParseBool(strings.TrimSpace(x))
			if err != nil {
				return bad("is not true or false")
			}
			f.SetBool(b)
		default:
			return bad("is not true or false")
		}
	case int:
		switch x := val.(type) {
		case int:
			f.SetInt(int64(x))
		case int64:
			f.SetInt(x)
		case uint64:
			if x > 1<<62 {
				return bad("is too large")
			}
			f.SetInt(int64(x))
		case string:
			n, err := strconv.Atoi(strings.TrimSpace(x))
			if err != nil {
				return bad("is not a whole number")
			}
			f.SetInt(int64(n))
		default:
			return bad("is not a whole number")
		}
	case float64:
		n, err := decodeFloat(val)
		if err != nil {
			return bad(err.Error())
		}
		f.SetFloat(n)
	case string:
		x, ok := val.(string)
		if !ok {
			return bad("is not a string")
		}
		f.SetString(x)
	case *bool:
		var on bool
		switch x := val.(type) {
		case bool:
			on = x
		case string:
			b, err := strconv.ParseBool(strings.TrimSpace(x))
			if err != nil {
				return bad("is not a boolean (use true or false)")
			}
			on = b
		default:
			return bad("is not a boolean (use true or false)")
		}
		f.Set(reflect.ValueOf(&on))
	case []string:
		list, err := stringList(val)
		if err != nil {
			return bad(err.Error())
		}
		f.Set(reflect.ValueOf(list))
	}
	return nil
}

// decodeFloat accepts a YAML number (whole or not), a flag's float64, or
// a string holding a decimal number (the environment's form). NaN and the
// infinities are refused: no limit compares sensibly with them.
func decodeFloat(val any) (float64, error) {
	var n float64
	switch x := val.(type) {
	case float64:
		n = x
	case int:
		n = float64(x)
	case int64:
		n = float64(x)
	case uint64:
		n = float64(x)
	case string:
		var err error
		if n, err = strconv.ParseFloat(strings.TrimSpace(x), 64); err != nil {
			return 0, errors.New("is not a number (write a decimal such as 0.5)")
		}
	default:
		return 0, errors.New("is not a number (write a decimal such as 0.5)")
	}
	if math.IsNaN(n) || math.IsInf(n, 0) {
		return 0, errors.New("is not a finite number (write a decimal such as 0.5)")
	}
	return n, nil
}

// stringList accepts a YAML list of strings, a flag's []string, or one
// comma-separated string (the environment's form). The comma-separated
// forms (a flag, a variable, a string in the file) are split the same
// way, each item trimmed of the spaces around it ("a, b" is a and b); the
// items of a YAML list are taken exactly, so Validate refuses one with
// surrounding spaces.
func stringList(val any) ([]string, error) {
	switch x := val.(type) {
	case []string:
		out := make([]string, len(x))
		for i := range x {
			out[i] = strings.TrimSpace(x[i])
		}
		return out, nil
	case string:
		parts := strings.Split(x, ",")
		for i := range parts {
			parts[i] = strings.TrimSpace(parts[i])
		}
		return parts, nil
	case []any:
		out := make([]string, 0, len(x))
		for i, item := range x {
			s, ok := item.(string)
			if !ok {
				return nil, fmt.Errorf("is not a list of names: item %d (%v) is not a string", i+1, item)
			}
			out = append(out, s)
		}
		return out, nil
	}
	return nil, errors.New("is not a list of names (write a YAML list or a comma-separated string)")
}

// decodeCascades reads the file's cascades: a map from job type to a map
// with on_failed, on_completed and on_requeued, each a list of SQL
// statements (or one statement as a string).
func decodeCascades(val any) (jobs.Cascades, []error) {
	if val == nil {
		return nil, nil
	}
	types, ok := val.(map[string]any)
	if !ok {
		return nil, []error{&FieldError{Key: keyCascades, Msg: "cascades is not a map from job type to on_failed/on_completed/on_requeued statements"}}
	}
	out := jobs.Cascades{}
	var errs []error
	for _, typ := range slices.Sorted(maps.Keys(types)) {
		key := fmt.Sprintf("cascades[%q]", typ)
		kinds, ok := types[typ].(map[string]any)
		if !ok {
			errs = append(errs, &FieldError{Key: key, Msg: key + " is not a map with on_failed, on_completed and/or on_requeued"})
			continue
		}
		var c jobs.Cascade
		for _, kind := range slices.Sorted(maps.Keys(kinds)) {
			stmts, err := statements(kinds[kind])
			switch {
			case kind != jobs.HookOnFailed && kind != jobs.HookOnCompleted && kind != jobs.HookOnRequeued:
				msg := fmt.Sprintf("%s: unknown key %q (known keys: on_failed, on_completed, on_requeued)", key, kind)
				errs = append(errs, &FieldError{Key: key, Msg: msg})
			case err != nil:
				errs = append(errs, &FieldError{Key: key + "." + kind, Msg: key + "." + kind + " " + err.Error()})
			case kind == jobs.HookOnFailed:
				c.OnFailed = stmts
			case kind == jobs.HookOnCompleted:
				c.OnCompleted = stmts
			default:
				c.OnRequeued = stmts
			}
		}
		out[typ] = c
	}
	return out, errs
}

func statements(val any) ([]string, error) {
	switch x := val.(type) {
	case string:
		return []string{x}, nil
	case []any:
		out := make([]string, 0, len(x))
		for i, item := range x {
			s, ok := item.(string)
			if !ok {
				return nil, fmt.Errorf("statement %d is not a string", i+1)
			}
			out = append(out, s)
		}
		return out, nil
	}
	return nil, errors.New("is not a list of SQL statements")
}

// display renders a value for an error message: secret settings only
// through redact.URL, strings quoted.
func display(s setting, val any) string {
	if s.secret {
		return redact.URL(fmt.Sprint(val))
	}
	if str, ok := val.(string); ok {
		return strconv.Quote(str)
	}
	return fmt.Sprint(val)
}
