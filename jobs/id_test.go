package jobs_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"strings"
	"testing"

	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
)

func TestCheckID(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, id string
		bad      string // "" when the ID is good, else a part of the error
	}{
		{"PlainID", "report:tenant42:2026-11-30", ""},
		{"UnicodeID", "rapport-été-日本", ""},
		{"AtTheLimit", strings.Repeat("a", jobs.MaxIDLength), ""},
		{"Empty", "", "empty"},
		{"NulByte", "job\x00x", `"job\x00x" contains a NUL byte`},
		{"InvalidUTF8", "job\xff", `"job\xff" is not valid UTF-8`},
		{"OverTheLimit", strings.Repeat("a", jobs.MaxIDLength+1), "is 1025 bytes, over the limit of 1024"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			err := jobs.CheckID(tc.id)
			if tc.bad == "" {
				requireNoErr(t, err)
				return
			}
			requireIs(t, err, jobs.ErrBadID)
			if !strings.Contains(err.Error(), tc.bad) {
				t.Fatalf("error %q lacks %q", err, tc.bad)
			}
		})
	}
}

// TestCheckIDMatchesPostgreSQL shows the rule is PostgreSQL's: what CheckID
// refuses for bytes fails to insert, what it accepts inserts. The length
// limit is jobreaper's own, below the B-tree entry limit (an ID a little
// over the limit still inserts; one of 3,000 uncompressible bytes does not).
func TestCheckIDMatchesPostgreSQL(t *testing.T) {
	t.Parallel()
	db := jobstest.New(t)
	insert := func(id string) error {
		_, err := db.Pool.Exec(context.Background(), `INSERT INTO jobs (id, type, status) VALUES ($1, 'x', 'QUEUED')`, id)
		return err
	}
	for _, id := range []string{"job\x00x", "job\xff"} {
		if jobs.CheckID(id) == nil {
			t.Fatalf("CheckID(%q) accepted it", id)
		}
		if err := insert(id); err == nil {
			t.Fatalf("PostgreSQL stored %q although CheckID refuses it", id)
		}
	}
	for _, id := range []string{"rapport-été-日本", strings.Repeat("é", jobs.MaxIDLength/2)} {
		requireNoErr(t, jobs.CheckID(id))
		requireNoErr(t, insert(id))
	}
	// 3,008 random hex bytes (they do not compress) exceed the B-tree entry
	// limit of the primary key: the limit is there for a reason.
	raw := make([]byte, 1504)
	_, _ = rand.Read(raw)
	long := hex.EncodeToString(raw)
	requireIs(t, jobs.CheckID(long), jobs.ErrBadID)
	if err := insert(long); err == nil || !strings.Contains(err.Error(), "index row") {
		t.Fatalf("inserting an ID of %d random bytes: %v, want PostgreSQL's index row size error", len(long), err)
	}
}
