package jobs

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// SchemaDefault is the PostgreSQL schema jobreaper's tables live in unless
// configured otherwise.
const SchemaDefault = "public"

var schemaPattern = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,62}$`)

// ErrBadSchema is returned by Connect for a schema name that is not a plain
// PostgreSQL identifier (letters, digits, underscore; at most 63 bytes).
var ErrBadSchema = errors.New("schema name must be a plain identifier: letters, digits and underscore, at most 63 characters, not starting with a digit")

// ValidSchema reports whether schema is a name Connect accepts: a plain
// PostgreSQL identifier (letters, digits, underscore, not starting with a
// digit, at most 63 bytes).
func ValidSchema(schema string) bool { return schemaPattern.MatchString(schema) }

// Connect opens a pool to the database at databaseURL whose connections
// look up tables in schema first (see SearchPath), so every statement of
// this package reaches the tables of that schema while the product's tables
// named unqualified in cascades and completion transactions still resolve.
// The URL's application_name is kept; without one it is "jobreaper". It
// pings once so that a wrong URL or credentials fail here.
//
// Errors: ErrBadSchema for a malformed schema name; otherwise an error that
// names the host but never the password of databaseURL.
func Connect(ctx context.Context, databaseURL, schema string) (*pgxpool.Pool, error) {
	if !ValidSchema(schema) {
		return nil, fmt.Errorf("jobs.Connect: schema %q: %w", schema, ErrBadSchema)
	}
	cfg, err := pgxpool.ParseConfig(databaseURL)
	if err != nil {
		// pgx's parse errors can quote the URL; never pass them on.
		return nil, fmt.Errorf("jobs.Connect: database URL %s is not a valid PostgreSQL connection string", RedactURL(databaseURL))
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = SearchPath(schema, cfg.ConnConfig.RuntimeParams["search_path"])
	if cfg.ConnConfig.RuntimeParams["application_name"] == "" {
		cfg.ConnConfig.RuntimeParams["application_name"] = "jobreaper"
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("jobs.Connect: %s: %w", RedactURL(databaseURL), err)
	}
	pctx, cancel := context.WithTimeout(ctx, OpTimeoutDefault)
	defer cancel()
	if err := pool.Ping(pctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("jobs.Connect: cannot connect to PostgreSQL at %s: %w", RedactURL(databaseURL), redactErr(err, cfg.ConnConfig.Password))
	}
	return pool, nil
}

// SearchPath returns the search_path Connect sets: schema first, then the
// URL's own search_path (urlPath, as PostgreSQL takes it), or "public" when
// the URL sets none and schema is another one. jobreaper's tables are then
// found first, and unqualified names of the product's tables resolve as
// they would without jobreaper.
func SearchPath(schema, urlPath string) string {
	first := pgx.Identifier{schema}.Sanitize()
	switch {
	case strings.TrimSpace(urlPath) != "":
		return first + ", " + urlPath
	case schema == "public":
		return first
	default:
		return first + ", public"
	}
}

// RedactURL returns rawURL with any password replaced by "xxxxx", for logs
// and errors. A string that does not parse as a URL is returned as
// "<unparseable URL>" since it may hold a password in another form.
func RedactURL(rawURL string) string {
	u, err := url.Parse(rawURL)
	if err != nil || u.Scheme == "" {
		return "<unparseable URL>"
	}
	q := u.Query()
	if q.Has("password") {
		q.Set("password", "xxxxx")
		u.RawQuery = q.Encode()
	}
	return u.Redacted()
}

// redactErr hides password inside err's text while keeping err in the chain
// for errors.Is.
func redactErr(err error, password string) error {
	if password == "" {
		return err
	}
	return &redactedError{err: err, password: password}
}

type redactedError struct {
	err      error
	password string
}

func (e *redactedError) Error() string {
	return strings.ReplaceAll(e.err.Error(), e.password, "xxxxx")
}

func (e *redactedError) Unwrap() error { return e.err }
