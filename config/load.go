package config

import (
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"regexp"
	"slices"
	"strings"

	"github.com/knadh/koanf/providers/posflag"
	"github.com/knadh/koanf/v2"
	"github.com/spf13/pflag"
	"go.yaml.in/yaml/v3"
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
// validate the result: call Validate on it. It is LoadWithOrigins without
// the origins.
func Load(src Sources) (Config, error) {
	cfg, _, err := LoadWithOrigins(src)
	return cfg, err
}

// LoadWithOrigins builds a Config from the defaults overridden by src and
// says where each setting's value came from, for Origins.Annotate to name
// in Validate's errors. It does not validate the result.
//
// Errors: a file that cannot be read or is not YAML (naming the file and,
// when the parser gives it, the line); a key in the file that is not a
// setting (named with its line and the nearest known key: typos are never
// dropped); and every value that does not decode to its setting's type,
// naming the setting, the value (URLs only through redact.URL) and
// where it came from. Every problem with a key or a value is reported,
// joined with errors.Join, each a *FieldError.
func LoadWithOrigins(src Sources) (Config, Origins, error) {
	k := koanf.New(".")
	origins := Origins{}
	var errs []error
	if src.File != "" {
		raw, lines, err := readFile(src.File)
		if err != nil {
			return Config{}, nil, err
		}
		errs = append(errs, unknownKeys(src.File, raw, lines)...)
		for key := range raw {
			origins[key] = Origin{Kind: OriginFile, Key: key, Name: src.File, Line: lines[key]}
		}
		if err := k.Load(mapProvider(raw), nil); err != nil {
			return Config{}, nil, fmt.Errorf("config file %s: %w", src.File, err)
		}
	}
	env := envSettings(src.Environ)
	for key := range env {
		origins[key] = Origin{Kind: OriginEnv, Key: key, Name: envName(key)}
	}
	if err := k.Load(mapProvider(env), nil); err != nil {
		return Config{}, nil, fmt.Errorf("reading the environment: %w", err)
	}
	if src.Flags != nil {
		flags := posflag.ProviderWithFlag(src.Flags, ".", nil, func(f *pflag.Flag) (string, any) {
			key := strings.ReplaceAll(f.Name, "-", "_")
			flag, _, ok := Names(key)
			if !ok {
				return "", nil // --config, --output, --help and the like
			}
			if f.Changed {
				origins[key] = Origin{Kind: OriginFlag, Key: key, Name: flag}
			}
			return key, posflag.FlagVal(src.Flags, f)
		})
		if err := k.Load(flags, nil); err != nil {
			return Config{}, nil, fmt.Errorf("reading flags: %w", err)
		}
	}
	cfg, decodeErrs := decode(k.Raw())
	errs = append(errs, decodeErrs...)
	errs = append(errs, shadowedErrors(src, origins, env)...)
	return cfg, origins, origins.Annotate(errors.Join(errs...))
}

// shadowedErrors returns the decoding errors of the values that a later
// source overrides (a file's value under an environment variable or a
// flag, a variable's under a flag), each naming where it is: such a value
// is not used now, but it is still wrong, and it would be the day the
// override is dropped, so the file or the variable is fixed now. origins
// names each setting's final source; env holds the environment's
// settings.
func shadowedErrors(src Sources, origins Origins, env map[string]any) []error {
	var errs []error
	if src.File != "" {
		raw, lines, err := readFile(src.File)
		if err == nil {
			shadowed, fileOrigins := map[string]any{}, Origins{}
			for key, val := range raw {
				if o, ok := origins[key]; ok && o.Kind != OriginFile {
					shadowed[key] = val
					fileOrigins[key] = Origin{Kind: OriginFile, Key: key, Name: src.File, Line: lines[key]}
				}
			}
			_, fileErrs := decode(shadowed)
			errs = append(errs, fileOrigins.Annotate(errors.Join(fileErrs...)))
		}
	}
	shadowed, envOrigins := map[string]any{}, Origins{}
	for key, val := range env {
		if o, ok := origins[key]; ok && o.Kind == OriginFlag {
			shadowed[key] = val
			envOrigins[key] = Origin{Kind: OriginEnv, Key: key, Name: envName(key)}
		}
	}
	_, envErrs := decode(shadowed)
	errs = append(errs, envOrigins.Annotate(errors.Join(envErrs...)))
	return slices.DeleteFunc(errs, func(err error) bool { return err == nil })
}

// readFile reads the YAML file at path: its top-level mapping and the line
// of each of its keys.
func readFile(path string) (map[string]any, map[string]int, error) {
	if st, err := os.Stat(path); err == nil && st.IsDir() {
		return nil, nil, fmt.Errorf("config file %s is a directory: name the YAML file in it with --config or %s", path, EnvConfigFile)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		var pathErr *fs.PathError
		switch {
		case errors.Is(err, fs.ErrNotExist):
			return nil, nil, fmt.Errorf("config file %s does not exist: fix the path given by --config or %s", path, EnvConfigFile)
		case errors.As(err, &pathErr):
			return nil, nil, fmt.Errorf("config file %s cannot be read (%w): fix its permissions, or the path given by --config or %s",
				path, pathErr.Err, EnvConfigFile)
		default:
			return nil, nil, fmt.Errorf("config file %s cannot be read: %w", path, err)
		}
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(b, &doc); err != nil {
		problem := yamlProblem(err)
		if line := syntaxErrorLine(b); line > 0 {
			problem = fmt.Sprintf("line %d: %s", line, yamlLine.ReplaceAllString(problem, ""))
		}
		return nil, nil, fmt.Errorf("config file %s is not valid YAML: %s", path, problem)
	}
	root := &doc
	if root.Kind == yaml.DocumentNode && len(root.Content) > 0 {
		root = root.Content[0]
	}
	raw, lines := map[string]any{}, map[string]int{}
	switch {
	case root.Kind == 0, root.Kind == yaml.ScalarNode && root.Tag == "!!null":
		return raw, lines, nil // an empty file sets nothing
	case root.Kind != yaml.MappingNode:
		return nil, nil, fmt.Errorf("config file %s is not valid: line %d: the top level must be a mapping of settings (key: value), not a %s",
			path, root.Line, nodeKind(root))
	}
	if err := root.Decode(&raw); err != nil {
		return nil, nil, fmt.Errorf("config file %s is not valid YAML: %s", path, yamlProblem(err))
	}
	for i := 0; i+1 < len(root.Content); i += 2 {
		lines[root.Content[i].Value] = root.Content[i].Line
	}
	return raw, lines, nil
}

// yamlLine matches the line number the YAML parser puts before a syntax
// error's message.
var yamlLine = regexp.MustCompile(`^line [0-9]+: `)

// syntaxErrorLine returns the line of the syntax error in the YAML b: the
// line after the longest run of whole lines from the top that parses. The
// parser's own number cannot be used: for some errors it counts from 0,
// for others from 1, and on the first line it gives none. It returns 0
// for a file too long to search this way (the parser's message is used).
func syntaxErrorLine(b []byte) int {
	lines := strings.SplitAfter(string(b), "\n")
	if len(lines) > 2000 {
		return 0
	}
	good := 0
	for k := 1; k <= len(lines); k++ {
		var n yaml.Node
		if yaml.Unmarshal([]byte(strings.Join(lines[:k], "")), &n) == nil {
			good = k
		}
	}
	return good + 1
}

// yamlProblem returns the parser's message without its "yaml: " prefix,
// every line of a decoding error on one line ("line 2: ...").
func yamlProblem(err error) string {
	var te *yaml.TypeError
	if errors.As(err, &te) {
		return strings.Join(te.Errors, "; ")
	}
	return strings.TrimPrefix(err.Error(), "yaml: ")
}

func nodeKind(n *yaml.Node) string {
	switch n.Kind {
	case yaml.SequenceNode:
		return "list"
	case yaml.ScalarNode:
		return "single value"
	default:
		return "YAML node of another kind"
	}
}

// unknownKeys reports every top-level key of the file that is not a
// setting, with its line. (A cascade's keys other than on_failed,
// on_completed and on_requeued are reported by decodeCascades.)
func unknownKeys(path string, raw map[string]any, lines map[string]int) []error {
	known := knownKeys()
	var errs []error
	for _, key := range slices.Sorted(maps.Keys(raw)) {
		if slices.Contains(known, key) {
			continue
		}
		msg := fmt.Sprintf("config file %s line %d: unknown key %q", path, lines[key], key)
		if near := Closest(key, known); near != "" {
			msg += fmt.Sprintf(" (did you mean %q?)", near)
		} else {
			msg += " (known keys: " + strings.Join(known, ", ") + ")"
		}
		errs = append(errs, &FieldError{Key: key, Msg: msg, unknownKey: true})
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
