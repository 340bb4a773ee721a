package jobs

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"strings"

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

// Connect opens a pool to the database at databaseURL. It sends no
// setting as a startup parameter of its own except application_name
// (the URL's, or "jobreaper" when it sets none), which PgBouncer accepts;
// in particular it sets no search_path, which a transaction-mode pooler
// drops or refuses. jobreaper's statements name schema themselves (see
// WithSchema), so the pool works the same behind such a pooler. Unqualified
// names in operator cascades and in the caller's completion transactions
// are the product's: they resolve through the connection's own search_path
// (the server's or the role's default, usually "$user", public, or a
// search_path the URL sets, on a direct connection). It pings once so that
// a wrong URL or credentials fail here.
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

// RedactURL returns rawURL with any password replaced by "xxxxx", for logs
// and errors. A string that does not parse as a URL is returned as
// "<unparseable URL>" since it may hold a password in another form.
func RedactURL(rawURL string) string {
	if !strings.Contains(rawURL, "://") && keywordDSN.MatchString(rawURL) {
		return redactKeywordDSN(rawURL)
	}
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

// keywordDSN matches PostgreSQL's keyword/value connection strings
// ("host=db user=app password=... dbname=app"), which pgx accepts as well
// as URLs: one or more key=value pairs separated by spaces.
var keywordDSN = regexp.MustCompile(`^\s*[A-Za-z_]+\s*=`)

// dsnPassword matches the password of a keyword/value string: a quoted
// value (with \' and \\ escapes, as libpq reads it) or a bare word.
var dsnPassword = regexp.MustCompile(`(?i)\bpassword\s*=\s*('(?:[^'\\]|\\.)*'?|\S*)`)

// redactKeywordDSN returns a keyword/value connection string with its
// password's value replaced by xxxxx.
func redactKeywordDSN(dsn string) string {
	return dsnPassword.ReplaceAllString(dsn, "password=xxxxx")
}
