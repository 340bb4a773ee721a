package redact

import (
	"strings"
	"testing"
)

func TestRedactURLHidesKeywordPasswords(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"host=127.0.0.1 user=postgres password=S3cretPW dbname=app port=5999": "host=127.0.0.1 user=postgres password=xxxxx dbname=app port=5999",
		"host=db password = 'S3cret PW\\'x' dbname=app":                       "host=db password=xxxxx dbname=app",
		"host=db PASSWORD=S3cretPW":                                           "host=db password=xxxxx",
		"postgres://app:S3cretPW@db:5432/app?sslmode=disable":                 "postgres://app:xxxxx@db:5432/app?sslmode=disable",
		"postgres://app@db:5432/app?password=S3cretPW":                        "postgres://app@db:5432/app?password=xxxxx",
		"not a url S3cretPW":                                                  "<unparseable URL>",
	} {
		if got := URL(in); got != want || strings.Contains(got, "S3cret") {
			t.Errorf("URL(%q) = %q, want %q", in, got, want)
		}
	}
}

// Passwords in the other places an operator puts them (found by
// FuzzRedactURL and FuzzConfigNeverShowsAPassword): the TLS key's
// sslpassword, Sentinel's sentinel_password, a password parameter after a
// stray '?' or in a fragment, and a password whose unescaped '#' or '/'
// ended the URL's authority early.
func TestRedactURLHidesPasswordsOutsideTheUserInformation(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"postgres://app@db/app?sslmode=verify-full&sslpassword=S3cretPW":       "postgres://app@db/app?sslmode=verify-full&sslpassword=xxxxx",
		"redis://:S3cretPW@s1:26379?master_name=m&sentinel_password=S3cretPW":  "redis://:xxxxx@s1:26379?master_name=m&sentinel_password=xxxxx",
		"postgres://app@db/app?sslmode=require?password=S3cretPW":              "postgres://app@db/app?sslmode=require?password=xxxxx",
		"postgres://app@db/app#&password=S3cretPW":                             "postgres://app@db/app#&password=xxxxx",
		"postgres://app:5432#S3cretPW@db:5432/app":                             "postgres://xxxxx@db:5432/app",
		"postgres://app:5432/S3cretPW@db:5432/app?password=S3cretPW":           "postgres://xxxxx@db:5432/app?password=xxxxx",
		"host=db sslpassword=S3cretPW sslkey=/k.pem":                           "host=db sslpassword=xxxxx sslkey=/k.pem",
		"postgres://app:S3cretPW@db:5432/app?application_name=ops@example.com": "postgres://app:xxxxx@db:5432/app?application_name=ops@example.com",
	} {
		if got := URL(in); got != want || strings.Contains(got, "S3cret") {
			t.Errorf("URL(%q) = %q, want %q", in, got, want)
		}
	}
}
