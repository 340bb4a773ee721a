package demo

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// TestSearchPostgresFindsTheNewestVersionedDirectory lays out Debian's
// /usr/lib/postgresql/<version>/bin under a temporary root with PATH
// lacking the binaries: the newest complete directory wins, numerically
// (15 over 9.6), and one without postgres is passed over.
func TestSearchPostgresFindsTheNewestVersionedDirectory(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	for dir, progs := range map[string][]string{
		"9.6": {"initdb", "postgres"},
		"15":  {"initdb", "postgres"},
		"17":  {"initdb"}, // client-only install: no server
	} {
		bin := filepath.Join(root, "usr/lib/postgresql", dir, "bin")
		if err := os.MkdirAll(bin, 0o755); err != nil {
			t.Fatal(err)
		}
		for _, p := range progs {
			if err := os.WriteFile(filepath.Join(bin, p), []byte("#!/bin/sh\n"), 0o755); err != nil {
				t.Fatal(err)
			}
		}
	}
	noPath := func(string) (string, error) { return "", errors.New("not in PATH") }

	got, err := searchPostgres(noPath, []string{filepath.Join(root, "usr/lib/postgresql/*/bin")})
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(root, "usr/lib/postgresql/15/bin"); got.dir != want || got.initdb != filepath.Join(want, "initdb") || got.postgres != filepath.Join(want, "postgres") {
		t.Errorf("found %+v, want the binaries in %s", got, want)
	}

	if _, err := searchPostgres(noPath, []string{filepath.Join(root, "nowhere/*/bin")}); !errors.Is(err, errNoPostgres) {
		t.Errorf("with nothing installed: %v, want errNoPostgres", err)
	}
}
