package config

import (
	"os"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// docsRow is one row of docs/configuration.md's settings table.
type docsRow struct {
	key, flag, env, def string
}

var docsCell = regexp.MustCompile("^`([^`]*)`")

// docsConfigTable returns the table of docs/configuration.md's "## Settings"
// section by YAML key.
func docsConfigTable(t *testing.T) map[string]docsRow {
	t.Helper()
	b, err := os.ReadFile("../docs/configuration.md")
	if err != nil {
		t.Fatal(err)
	}
	text := string(b)
	start := strings.Index(text, "\n## Settings\n")
	if start < 0 {
		t.Fatal(`docs/configuration.md has no "## Settings" section`)
	}
	section := text[start+1:]
	if end := strings.Index(section[3:], "\n## "); end >= 0 {
		section = section[:end+3]
	}
	rows := map[string]docsRow{}
	for _, line := range strings.Split(section, "\n") {
		if !strings.HasPrefix(line, "| `") {
			continue
		}
		cells := strings.Split(strings.Trim(line, "|"), "|")
		if len(cells) < 5 {
			t.Fatalf("configuration row has %d cells, want 5: %s", len(cells), line)
		}
		cell := func(i int) string {
			c := strings.TrimSpace(cells[i])
			if m := docsCell.FindStringSubmatch(c); m != nil {
				return m[1]
			}
			return c
		}
		r := docsRow{key: cell(0), flag: cell(1), env: cell(2), def: cell(3)}
		rows[r.key] = r
	}
	return rows
}

// TestDocsConfigurationTableMatchesConfig keeps the configuration
// reference from drifting: every Config field has a row in
// docs/configuration.md with its flag, environment variable and default,
// and every row is a field.
func TestDocsConfigurationTableMatchesConfig(t *testing.T) {
	t.Parallel()
	rows := docsConfigTable(t)
	defaults := reflect.ValueOf(Config{}.WithDefaults())
	typ := defaults.Type()
	fields := map[string]bool{}
	for i := range typ.NumField() {
		key := typ.Field(i).Tag.Get("koanf")
		if key == "" || key == "-" {
			continue
		}
		fields[key] = true
		row, ok := rows[key]
		if !ok {
			t.Errorf("docs/configuration.md's settings table has no row for %s", key)
			continue
		}
		if flag, env, ok := Names(key); ok {
			if row.flag != flag || row.env != env {
				t.Errorf("docs/configuration.md row %s names flag %q and env %q, want %q and %q", key, row.flag, row.env, flag, env)
			}
		} else if row.flag != "(file only)" || row.env != "(file only)" {
			t.Errorf("docs/configuration.md row %s names flag %q and env %q, want (file only)", key, row.flag, row.env)
		}
		checkDefault(t, key, row.def, defaults.Field(i).Interface())
	}
	for key := range rows {
		if !fields[key] {
			t.Errorf("docs/configuration.md documents %s, which is no Config field", key)
		}
	}
}

func checkDefault(t *testing.T, key, doc string, def any) {
	t.Helper()
	switch v := def.(type) {
	case time.Duration:
		d, err := time.ParseDuration(doc)
		if err != nil || d != v {
			t.Errorf("docs/configuration.md default of %s is %q, want %s", key, doc, v)
		}
	case int:
		if n, err := strconv.Atoi(doc); err != nil || n != v {
			t.Errorf("docs/configuration.md default of %s is %q, want %d", key, doc, v)
		}
	case float64:
		if f, err := strconv.ParseFloat(doc, 64); err != nil || f != v {
			t.Errorf("README default of %s is %q, want %g", key, doc, v)
		}
	case bool:
		if b, err := strconv.ParseBool(doc); err != nil || b != v {
			t.Errorf("docs/configuration.md default of %s is %q, want %t", key, doc, v)
		}
	case string:
		if v == "" && (key == "redis_ca_file" || key == "redis_tls_server_name") { // optional, no default
			if !strings.HasPrefix(doc, "none") {
				t.Errorf("docs/configuration.md default of %s is %q, want none: ...", key, doc)
			}
		} else if v == "" {
			if doc != "(required)" {
				t.Errorf("docs/configuration.md default of %s is %q, want (required)", key, doc)
			}
		} else if doc != v {
			t.Errorf("docs/configuration.md default of %s is %q, want %q", key, doc, v)
		}
	case *bool:
		if v == nil || doc != strconv.FormatBool(*v) {
			t.Errorf("docs/configuration.md default of %s is %q, want %v", key, doc, v)
		}
	default:
		if !reflect.ValueOf(v).IsZero() {
			t.Errorf("Config default of %s is %v; teach this test to compare it", key, v)
		}
	}
}
