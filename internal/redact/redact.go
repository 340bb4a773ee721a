// Package redact hides passwords in connection strings and in the errors
// that quote them, for logs and error messages: PostgreSQL's URLs and
// keyword/value strings, and Redis's URLs (Sentinel's sentinel_password
// included).
package redact

import (
	"net/url"
	"regexp"
	"strings"
)

// URL returns rawURL with any password replaced by "xxxxx", for logs
// and errors: the user information's, every password parameter's
// (password, sslpassword, sentinel_password, wherever a stray '?' or a
// missing one put it), a keyword/value string's password and sslpassword,
// and everything before the '@' of a URL whose password held an unescaped
// '/', '?' or '#'. A string that does not parse as a URL is returned as
// "<unparseable URL>" since it may hold a password in another form.
func URL(rawURL string) string {
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
		tail := URL(u.Scheme + "://" + rest[at+1:])
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

// Error returns err with every occurrence of password in its text replaced
// by "xxxxx", still wrapping err for errors.Is and errors.As; err itself
// when password is empty.
func Error(err error, password string) error {
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
