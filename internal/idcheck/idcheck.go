// Package idcheck holds the rules for the names jobreaper sends to
// PostgreSQL or uses as metric labels: a job ID, a name read from Redis or
// PostgreSQL (a queue name, a job type), and a schema name. It sends
// nothing anywhere.
package idcheck

import (
	"errors"
	"fmt"
	"regexp"
	"strings"
	"unicode/utf8"
)

// MaxIDLength bounds a job ID (bytes), and a name read from outside: far
// above any ID a product makes, and below what a PostgreSQL B-tree entry of
// the primary key can hold (jobs.MaxIDLength says why 1,024).
const MaxIDLength = 1024

// ErrBadID: a job ID that PostgreSQL cannot store in a text column (a NUL
// byte, bytes that are not valid UTF-8), or one longer than MaxIDLength
// (which a jobs row may still hold, written by the product's own SQL: such
// a job is outside what jobreaper acts on, and the message says so rather
// than that the row cannot exist).
// asynq accepts any string as a task ID, so another producer sharing the
// Redis can enqueue such a task; jobreaper counts and skips it instead of
// sending it to PostgreSQL, where it would fail the whole statement.
var ErrBadID = errors.New("not a job ID jobreaper accepts (empty, over 1,024 bytes, a NUL byte or invalid UTF-8)")

// CheckID reports whether id can be a job ID: not empty, valid UTF-8 (the
// encoding of a text column in a UTF8 database, which rejects anything else
// with "invalid byte sequence"), without a NUL byte (which no PostgreSQL
// text value can hold, whatever the encoding), and at most MaxIDLength
// bytes. It sends nothing anywhere.
//
// The error wraps ErrBadID and says which rule failed; it shows the ID
// escaped (%q), so a log line carrying it stays one readable line. An ID
// over the length limit is shown by its first 64 bytes only.
func CheckID(id string) error {
	if id == "" {
		return fmt.Errorf("job ID is empty: %w", ErrBadID)
	}
	return checkText("job ID", id, ErrBadID)
}

// ErrBadName: a name read from Redis or PostgreSQL (a queue name, a job
// type) that PostgreSQL text cannot hold (a NUL byte, bytes that are not
// valid UTF-8) or that is longer than MaxIDLength. Such a name can be
// neither a SQL parameter nor a Prometheus label value (the client library
// panics on invalid UTF-8).
var ErrBadName = errors.New("name cannot be a PostgreSQL text value or a metric label")

// CheckName applies CheckID's rules, except that an empty name is
// allowed, to a name that comes from outside jobreaper: valid UTF-8, no
// NUL byte, at most MaxIDLength bytes (far above any queue or type name;
// a longer one would make every log line and label carrying it huge).
// what names the kind of name for the message ("queue name", "job type").
// Another client sharing the Redis can put any bytes into asynq:queues,
// so the daemon checks every such name before it sends it to PostgreSQL
// or uses it as a label. It sends nothing anywhere.
//
// The error wraps ErrBadName and says which rule failed, the name escaped
// as CheckID shows an ID.
func CheckName(what, name string) error {
	return checkText(what, name, ErrBadName)
}

// checkText is the rule CheckID and CheckName share: at most MaxIDLength
// bytes, no NUL byte, valid UTF-8. The error names what, shows s escaped
// and wraps kind.
func checkText(what, s string, kind error) error {
	switch {
	case len(s) > MaxIDLength:
		return fmt.Errorf("%s %q... is %d bytes, over the limit of %d: %w", what, truncate(s, 64), len(s), MaxIDLength, kind)
	case strings.IndexByte(s, 0) >= 0:
		return fmt.Errorf("%s %q contains a NUL byte, which PostgreSQL text cannot hold: %w", what, s, kind)
	case !utf8.ValidString(s):
		return fmt.Errorf("%s %q is not valid UTF-8: %w", what, s, kind)
	}
	return nil
}

// QuoteID returns id escaped as a Go string literal (%q), cut to its first
// 64 bytes with its length added when longer, for log lines about task IDs
// (or any name read from Redis) that may hold control bytes, invalid UTF-8
// or megabytes.
func QuoteID(id string) string {
	const shown = 64
	if len(id) > shown {
		return fmt.Sprintf("%q...(%d bytes)", truncate(id, shown), len(id))
	}
	return fmt.Sprintf("%q", id)
}

// truncate returns at most n bytes of s.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}

var schemaPattern = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,62}$`)

// ValidSchema reports whether schema is a plain PostgreSQL identifier
// (letters, digits, underscore, not starting with a digit, at most 63
// bytes): the schema names jobs.Connect, jobs.Migrate and the config
// accept.
func ValidSchema(schema string) bool { return schemaPattern.MatchString(schema) }

// SystemSchema reports whether schema is one PostgreSQL keeps for itself:
// information_schema, or a name starting with pg_ (reserved for system
// purposes; PostgreSQL refuses to create one). jobreaper's tables never
// belong there, and a typo such as --schema information_schema would
// otherwise put them among the catalog's views.
func SystemSchema(schema string) bool {
	lower := strings.ToLower(schema)
	return lower == "information_schema" || strings.HasPrefix(lower, "pg_")
}
