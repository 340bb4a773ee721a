package redact

import (
	"strings"
	"testing"
)

// FuzzRedactURL puts a password into a connection string in every place
// an operator might (a URL's user information, a password, sslpassword or
// sentinel_password query parameter, a keyword=value string), with a
// character in its middle that URLs give a meaning to ('#', '/', '?',
// '@', ...), around any other text: URL's result, which goes into
// logs and errors, never holds either half of it.
func FuzzRedactURL(f *testing.F) {
	for _, s := range []struct {
		form      uint8
		sep, pre  string
		post, mid string
	}{
		{0, "", "u", "db:5432/app", ""}, {0, "#", "u", "db:5432/app", ""}, {0, "/", "u", "db/app", ""},
		{0, "?", "u", "db/app", ""}, {0, "@", "u", "db/app", ""}, {1, "", "u", "db/app?sslmode=require", ""},
		{2, "", "u", "db/app?x=1", ""}, {3, "", "", "cache:26379", ""}, {4, "", "host=db", "dbname=app", ""},
		{5, "", "host=db", "dbname=app", ""}, {6, "", "u", "db/app", "x=1"}, {7, "", "u", "db/app", ""},
		{8, "#", "u", "db/app", ""}, {8, "/", "u", "db/app", ""}, {8, "?", "u", "db/app", ""},
	} {
		f.Add(s.form, s.sep, s.pre, s.post, s.mid)
	}
	f.Fuzz(func(t *testing.T, form uint8, sep, pre, post, mid string) {
		const a, b = "S3cr3tA", "S3cr3tB"
		seps := []string{"", "#", "/", "?", "@", ":", "&", "%", " ", "=", ";"}
		first := a
		if form&8 != 0 {
			// A numeric first half reads as a port when the separator
			// ends the authority early ("postgres://u:5432#...").
			first = "5432"
		}
		if s := pick(seps, sep); s != "&" || form%8 == 0 || form%8 == 7 {
			// An '&' ends a URL parameter's value for every parser (the
			// operator must escape it); elsewhere it is the password's.
			first += s
		}
		pw := first + b
		var raw string
		switch form % 8 {
		case 0: // user information
			raw = "postgres://" + pre + ":" + pw + "@" + post
		case 1: // password query parameter
			raw = "postgres://" + pre + "@" + post + "&password=" + pw
		case 2: // the TLS key's password
			raw = "postgres://" + pre + "@" + post + "&sslpassword=" + pw
		case 3: // Redis Sentinel
			raw = "redis://:" + pw + "@" + post + "?master_name=m&sentinel_password=" + pw
		case 4: // keyword=value, the password quoted as libpq reads it
			raw = pre + " password='" + pw + "' " + post
		case 5: // keyword=value, TLS key
			raw = pre + " sslpassword='" + pw + "' " + post
		case 6: // a password parameter after a stray '?'
			raw = "postgres://" + pre + "@" + post + "?" + mid + "?password=" + pw
		case 7: // Redis
			raw = "rediss://" + pre + ":" + pw + "@" + post
		}
		got := URL(raw)
		if strings.Contains(got, a) || strings.Contains(got, b) {
			t.Fatalf("URL(%q) = %q shows the password", raw, got)
		}
	})
}

// pick maps any fuzzed string to one of choices.
func pick(choices []string, s string) string {
	n := 0
	for _, c := range []byte(s) {
		n += int(c)
	}
	return choices[n%len(choices)]
}
