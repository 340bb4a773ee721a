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

// readmeRow is one row of README.md's configuration table.
type readmeRow struct {
	key, flag, env, def string
}

var readmeCell = regexp.MustCompile("^`([^`]*)`")

// readmeConfigTable returns README.md's "## Configuration" table by YAML key.
func readmeConfigTable(t *testing.T) map[string]readmeRow {
	t.Helper()
	b, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	text := string(b)
	start := strings.Index(text, "\n## Configuration\n")
	if start < 0 {
		t.Fatal(`README.md has no "## Configuration" section`)
	}
	section := text[start+1:]
	if end := strings.Index(section[3:], "\n## "); end >= 0 {
		section = section[:end+3]
	}
	rows := map[string]readmeRow{}
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
			if m := readmeCell.FindStringSubmatch(c); m != nil {
				return m[1]
			}
			return c
		}
		r := readmeRow{key: cell(0), flag: cell(1), env: cell(2), def: cell(3)}
		rows[r.key] = r
	}
	return rows
}

// TestREADMEConfigurationTableMatchesConfig keeps the configuration
// reference from drifting: every Config field has a README row with its
// flag, environment variable and default, and every row is a field.
func TestREADMEConfigurationTableMatchesConfig(t *testing.T) {
	t.Parallel()
	rows := readmeConfigTable(t)
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
			t.Errorf("README.md's configuration table has no row for %s", key)
			continue
		}
		if flag, env, ok := Names(key); ok {
			if row.flag != flag || row.env != env {
				t.Errorf("README row %s names flag %q and env %q, want %q and %q", key, row.flag, row.env, flag, env)
			}
		} else if row.flag != "(file only)" || row.env != "(file only)" {
			t.Errorf("README row %s names flag %q and env %q, want (file only)", key, row.flag, row.env)
		}
		checkDefault(t, key, row.def, defaults.Field(i).Interface())
	}
	for key := range rows {
		if !fields[key] {
			t.Errorf("README.md documents %s, which is no Config field", key)
		}
	}
}

func checkDefault(t *testing.T, key, doc string, def any) {
	t.Helper()
	switch v := def.(type) {
	case time.Duration:
		d, err := time.ParseDuration(doc)
		if err != nil || d != v {
			t.Errorf("README default of %s is %q, want %s", key, doc, v)
		}
	case int:
		if n, err := strconv.Atoi(doc); err != nil || n != v {
			t.Errorf("README default of %s is %q, want %d", key, doc, v)
		}
	case float64:
		if f, err := strconv.ParseFloat(doc, 64); err != nil || f != v {
			t.Errorf("README default of %s is %q, want %g", key, doc, v)
		}
	case bool:
		if b, err := strconv.ParseBool(doc); err != nil || b != v {
			t.Errorf("README default of %s is %q, want %t", key, doc, v)
		}
	case string:
		if v == "" && (key == "redis_ca_file" || key == "redis_tls_server_name") { // optional, no default
			if !strings.HasPrefix(doc, "none") {
				t.Errorf("README default of %s is %q, want none: ...", key, doc)
			}
		} else if v == "" {
			if doc != "(required)" {
				t.Errorf("README default of %s is %q, want (required)", key, doc)
			}
		} else if doc != v {
			t.Errorf("README default of %s is %q, want %q", key, doc, v)
		}
	case *bool:
		if v == nil || doc != strconv.FormatBool(*v) {
			t.Errorf("README default of %s is %q, want %v", key, doc, v)
		}
	default:
		if !reflect.ValueOf(v).IsZero() {
			t.Errorf("Config default of %s is %v; teach this test to compare it", key, v)
		}
	}
}
