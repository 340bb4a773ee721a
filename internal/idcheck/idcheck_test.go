package idcheck

import (
	"errors"
	"strings"
	"testing"
)

// CheckName holds names from outside (queue names, job types) to CheckID's
// rules, except that an empty name is a name.
func TestCheckName(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, value string
		bad         string
	}{
		{"Plain", "reports", ""},
		{"Empty", "", ""},
		{"Unicode", "rapport-été", ""},
		{"AtTheLimit", strings.Repeat("q", MaxIDLength), ""},
		{"NulByte", "tenant\x00eu", `queue name "tenant\x00eu" contains a NUL byte`},
		{"InvalidUTF8", "bad\xffqueue", `queue name "bad\xffqueue" is not valid UTF-8`},
		{"OverTheLimit", strings.Repeat("q", MaxIDLength+1), "is 1025 bytes, over the limit of 1024"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			err := CheckName("queue name", tc.value)
			if tc.bad == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if !errors.Is(err, ErrBadName) {
				t.Fatalf("err = %v, want ErrBadName", err)
			}
			if !strings.Contains(err.Error(), tc.bad) {
				t.Fatalf("error %q lacks %q", err, tc.bad)
			}
		})
	}
}

func TestQuoteID(t *testing.T) {
	t.Parallel()
	for id, want := range map[string]string{
		"J1":                    `"J1"`,
		"odd\x00id":             `"odd\x00id"`,
		"bad\xff":               `"bad\xff"`,
		strings.Repeat("a", 70): `"` + strings.Repeat("a", 64) + `"...(70 bytes)`,
	} {
		if got := QuoteID(id); got != want {
			t.Errorf("QuoteID(%q) = %s, want %s", id, got, want)
		}
	}
}
