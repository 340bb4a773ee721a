package config

import (
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/knadh/koanf/parsers/yaml"
	"github.com/knadh/koanf/providers/file"
	"github.com/knadh/koanf/providers/posflag"
	"github.com/knadh/koanf/v2"
	"github.com/spf13/pflag"

	"github.com/jobreaper/jobreaper/jobs"
)

// Sources name where Load reads settings from. Each source overrides the
// ones before it: defaults, File, Environ, Flags.
type Sources struct {
	// File is the YAML file to read; "" reads none.
	File string
	// Environ holds "NAME=value" pairs as os.Environ returns them. Only the
	// JOBREAPER_<KEY> variable of each setting is read, and an empty value
	// counts as unset. Other JOBREAPER_ variables are ignored rather than
	// refused: orchestrators inject their own (Kubernetes adds
	// JOBREAPER_SERVICE_HOST and JOBREAPER_PORT to every pod when a Service
	// is named jobreaper).
	Environ []string
	// Flags are the flags RegisterFlags defined, after parsing. Only those
	// set on the command line count; nil reads none.
	Flags *pflag.FlagSet
}

// ConfigFile returns the YAML file to load: the --config flag when set in
// fs (which may be nil), else JOBREAPER_CONFIG from environ, else "".
func ConfigFile(fs *pflag.FlagSet, environ []string) string {
	if fs != nil {
		if f := fs.Lookup(FlagConfigFile); f != nil && f.Changed {
			return f.Value.String()
		}
	}
	for _, kv := range environ {
		if name, value, _ := strings.Cut(kv, "="); name == EnvConfigFile && value != "" {
			return value
		}
	}
	return ""
}

// Load builds a Config from the defaults overridden by src. It does not
// validate the result: call Validate on it.
//
// Errors: a file that cannot be read or is not YAML; a key in the file
// that is not a setting (named, with the nearest known key: typos are
// never dropped); and every value that does not decode to its setting's
// type, naming the setting and the value (URLs only through
// jobs.RedactURL). Every problem with a value is reported, joined with
// errors.Join, each a *FieldError.
func Load(src Sources) (Config, error) {
	k := koanf.New(".")
	var errs []error
	if src.File != "" {
		fk := koanf.New(".")
		if err := fk.Load(file.Provider(src.File), yaml.Parser()); err != nil {
			return Config{}, fileError(src.File, err)
		}
		errs = append(errs, unknownKeys(src.File, fk.Raw())...)
		if err := k.Merge(fk); err != nil {
			return Config{}, fmt.Errorf("config file %s: %w", src.File, err)
		}
	}
	if err := k.Load(mapProvider(envSettings(src.Environ)), nil); err != nil {
		return Config{}, fmt.Errorf("reading the environment: %w", err)
	}
	if src.Flags != nil {
		flags := posflag.ProviderWithFlag(src.Flags, ".", nil, func(f *pflag.Flag) (string, any) {
			key := strings.ReplaceAll(f.Name, "-", "_")
			if _, _, ok := Names(key); !ok {
				return "", nil // --config, --output, --help and the like
			}
			return key, posflag.FlagVal(src.Flags, f)
		})
		if err := k.Load(flags, nil); err != nil {
			return Config{}, fmt.Errorf("reading flags: %w", err)
		}
	}
	cfg, decodeErrs := decode(k.Raw())
	return cfg, errors.Join(append(errs, decodeErrs...)...)
}

func fileError(path string, err error) error {
	var pathErr *fs.PathError
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("config file %s does not exist (check --config or %s)", path, EnvConfigFile)
	case errors.As(err, &pathErr):
		return fmt.Errorf("config file %s cannot be read: %w", path, err)
	default:
		return fmt.Errorf("config file %s is not valid YAML: %w", path, err)
	}
}

// unknownKeys reports every top-level key of the file that is not a
// setting, and every key of a cascade that is not on_failed or
// on_completed.
func unknownKeys(path string, raw map[string]any) []error {
	known := knownKeys()
	var errs []error
	for _, key := range slices.Sorted(maps.Keys(raw)) {
		if slices.Contains(known, key) {
			continue
		}
		msg := fmt.Sprintf("config file %s: unknown key %q", path, key)
		if near := closest(key, known); near != "" {
			msg += fmt.Sprintf(" (did you mean %q?)", near)
		} else {
			msg += " (known keys: " + strings.Join(known, ", ") + ")"
		}
		errs = append(errs, &FieldError{Key: key, Msg: msg})
	}
	return errs
}

// envSettings picks the settings' variables out of environ.
func envSettings(environ []string) map[string]any {
	byName := map[string]string{}
	for _, s := range settings {
		byName[envName(s.key)] = s.key
	}
	out := map[string]any{}
	for _, kv := range environ {
		name, value, _ := strings.Cut(kv, "=")
		if key, ok := byName[name]; ok && value != "" {
			out[key] = value
		}
	}
	return out
}

// mapProvider is a koanf.Provider over a ready map.
type mapProvider map[string]any

func (m mapProvider) ReadBytes() ([]byte, error)    { return nil, errors.New("mapProvider has no bytes") }
func (m mapProvider) Read() (map[string]any, error) { return m, nil }

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
	case string:
		x, ok := val.(string)
		if !ok {
			return bad("is not a string")
		}
		f.SetString(x)
	case []string:
		list, err := stringList(val)
		if err != nil {
			return bad(err.Error())
		}
		f.Set(reflect.ValueOf(list))
	}
	return nil
}

// stringList accepts a YAML list of strings, a flag's []string, or one
// comma-separated string (the environment's form).
func stringList(val any) ([]string, error) {
	switch x := val.(type) {
	case []string:
		return x, nil
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
// with on_failed and on_completed, each a list of SQL statements (or one
// statement as a string).
func decodeCascades(val any) (jobs.Cascades, []error) {
	if val == nil {
		return nil, nil
	}
	types, ok := val.(map[string]any)
	if !ok {
		return nil, []error{&FieldError{Key: keyCascades, Msg: "cascades is not a map from job type to on_failed/on_completed statements"}}
	}
	out := jobs.Cascades{}
	var errs []error
	for _, typ := range slices.Sorted(maps.Keys(types)) {
		key := fmt.Sprintf("cascades[%q]", typ)
		kinds, ok := types[typ].(map[string]any)
		if !ok {
			errs = append(errs, &FieldError{Key: key, Msg: key + " is not a map with on_failed and/or on_completed"})
			continue
		}
		var c jobs.Cascade
		for _, kind := range slices.Sorted(maps.Keys(kinds)) {
			stmts, err := statements(kinds[kind])
			switch {
			case kind != jobs.HookOnFailed && kind != jobs.HookOnCompleted:
				msg := fmt.Sprintf("%s: unknown key %q (known keys: on_failed, on_completed)", key, kind)
				errs = append(errs, &FieldError{Key: key, Msg: msg})
			case err != nil:
				errs = append(errs, &FieldError{Key: key + "." + kind, Msg: key + "." + kind + " " + err.Error()})
			case kind == jobs.HookOnFailed:
				c.OnFailed = stmts
			default:
				c.OnCompleted = stmts
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
// through jobs.RedactURL, strings quoted.
func display(s setting, val any) string {
	if s.secret {
		return jobs.RedactURL(fmt.Sprint(val))
	}
	if str, ok := val.(string); ok {
		return strconv.Quote(str)
	}
	return fmt.Sprint(val)
}
