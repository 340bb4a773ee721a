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
// Each of configure, when given, adjusts the pool's configuration before
// the pool is created (ConnWatch.Install puts the daemon's tracer there).
//
// Errors: ErrBadSchema for a malformed schema name; otherwise an error that
// names the host but never the password of databaseURL.
func Connect(ctx context.Context, databaseURL, schema string, configure ...func(*pgxpool.Config)) (*pgxpool.Pool, error) {
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
	for _, c := range configure {
		c(cfg)
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
// and errors: the user information's, every password parameter's
// (password, sslpassword, sentinel_password, wherever a stray '?' or a
// missing one put it), a keyword/value string's password and sslpassword,
// and everything before the '@' of a URL whose password held an unescaped
// '/', '?' or '#'. A string that does not parse as a URL is returned as
// "<unparseable URL>" since it may hold a password in another form.
func RedactURL(rawURL string) string {
	if !strings.Contains(rawURL, "://") && keywordDSN.MatchString(rawURL) {
		return redactKeywordDSN(rawURL)
	}
	// Every password parameter (password, sslpassword,
	// sentinel_password) first, wherever it ended up: in the query, or in
	// the path or fragment of a URL that lacks or repeats its '?'.
	rawURL = urlPassword.ReplaceAllString(rawURL, "${1}xxxxx")
	u, err := url.Parse(rawURL)
	if err != nil || u.Scheme == "" {
		return "<unparseable URL>"
	}
	// A password holding an unescaped '/', '?' or '#' ends the authority
	// early ("postgres://u:5432#rest@db/app" parses as host u, port
	// 5432, and no password): the rest of it and its '@' land in the
	// path, query or fragment. Everything before the last '@' is hidden
	// then. A URL whose password was recognized keeps a later '@' (as in
	// application_name=ops@example.com).
	rest := rawURL[strings.Index(rawURL, "://")+len("://"):]
	_, hasPassword := u.User.Password()
	if end, at := strings.IndexAny(rest, "/?#"), strings.LastIndex(rest, "@"); !hasPassword && end >= 0 && at > end {
		tail := RedactURL(u.Scheme + "://" + rest[at+1:])
		if tail == "<unparseable URL>" {
			return tail
		}
		return u.Scheme + "://xxxxx@" + strings.TrimPrefix(tail, u.Scheme+"://")
	}
	return u.Redacted()
}

// urlPassword matches the value of a password parameter in a URL: a key
// ending in "password" up to the next '&' (an unescaped '#' in the
// password would start the fragment: the fragment is hidden with it).
var urlPassword = regexp.MustCompile(`(?i)(password=)[^&]*`)

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

// dsnPassword matches the password of a keyword/value string (password, or
// sslpassword for the TLS key): a quoted value (with \' and \\ escapes, as
// libpq reads it) or a bare word.
var dsnPassword = regexp.MustCompile(`(?i)\b(ssl)?password\s*=\s*('(?:[^'\\]|\\.)*'?|\S*)`)

// redactKeywordDSN returns a keyword/value connection string with its
// password's value replaced by xxxxx.
func redactKeywordDSN(dsn string) string {
	return dsnPassword.ReplaceAllString(dsn, "${1}password=xxxxx")
}
