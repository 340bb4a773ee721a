package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/jobreaper/jobreaper/jobs/jobstest"
)

// freshSchema returns the name of a schema that does not exist yet,
// dropped again at cleanup, and a connection to read it with.
func freshSchema(t *testing.T) (string, *pgx.Conn) {
	t.Helper()
	schema := jobstest.SchemaName(t)
	conn, err := pgx.Connect(t.Context(), jobstest.DatabaseURL())
	if err != nil {
		t.Fatalf("PostgreSQL for tests is not reachable (%v); run `make services` or set JOBREAPER_TEST_DATABASE_URL", err)
	}
	t.Cleanup(func() {
		ctx := context.WithoutCancel(t.Context())
		if _, err := conn.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE"); err != nil {
			t.Errorf("dropping schema %s: %v", schema, err)
		}
		_ = conn.Close(ctx)
	})
	return schema, conn
}

// migrationVersions returns the versions of the migrations in
// jobs/migrations, in order, as migrate prints them.
func migrationVersions(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob("../../jobs/migrations/*.sql")
	if err != nil || len(files) == 0 {
		t.Fatalf("no migration files found (%v)", err)
	}
	var versions []string
	for _, f := range files {
		prefix, _, _ := strings.Cut(filepath.Base(f), "_")
		v, err := strconv.ParseInt(prefix, 10, 64)
		if err != nil {
			t.Fatalf("migration %s has no numeric version", f)
		}
		versions = append(versions, strconv.FormatInt(v, 10))
	}
	return versions
}

func TestMigrate(t *testing.T) {
	t.Parallel()

	t.Run("CreatesTheTablesAndASecondRunAppliesNothing", func(t *testing.T) {
		t.Parallel()
		schema, conn := freshSchema(t)

		first := run(t, "migrate", "--database-url", jobstest.DatabaseURL(), "--schema", schema)
		requireExit(t, first, exitOK)
		versions := migrationVersions(t)
		want := fmt.Sprintf("applied %d migration(s) to schema %q: %s\n", len(versions), schema, strings.Join(versions, ", "))
		if first.stdout != want {
			t.Fatalf("first run printed %q, want %q", first.stdout, want)
		}
		var tables []string
		rows, err := conn.Query(t.Context(), `SELECT table_name::text FROM information_schema.tables
WHERE table_schema = $1 AND table_name IN ('job_types', 'jobs', 'job_events', 'job_batches', 'jobreaper_schema_version')
ORDER BY 1`, schema)
		if err != nil {
			t.Fatal(err)
		}
		if tables, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
			t.Fatal(err)
		}
		if strings.Join(tables, ",") != "job_batches,job_events,job_types,jobreaper_schema_version,jobs" {
			t.Fatalf("tables in %s: %v", schema, tables)
		}

		second := run(t, "migrate", "--database-url", jobstest.DatabaseURL(), "--schema", schema)
		requireExit(t, second, exitOK)
		if second.stdout != `schema "`+schema+`" is up to date: no migration applied`+"\n" {
			t.Fatalf("second run printed %q", second.stdout)
		}
	})

	t.Run("UnreachableDatabaseExits2WithoutThePassword", func(t *testing.T) {
		t.Parallel()
		r := run(t, "migrate", "--database-url", "postgres://postgres:secret@127.0.0.1:1/x")
		requireExit(t, r, exitCannotRun)
		requireOneLineError(t, r, "PostgreSQL", "127.0.0.1:1", "--database-url")
		if strings.Contains(r.stdout+r.stderr, "secret") {
			t.Fatalf("the password leaked: %q", r.stderr)
		}
	})

	t.Run("IgnoresDaemonOnlySettings", func(t *testing.T) {
		t.Parallel()
		schema, conn := freshSchema(t)
		file := filepath.Join(t.TempDir(), "jobreaper.yaml")
		yaml := "interval: 5 minutes\nqueues: [\"\"]\ncascades:\n  report.export:\n    on_failed: [\"UPDATE x SET y = @nope\"]\n"
		if err := os.WriteFile(file, []byte(yaml), 0o600); err != nil {
			t.Fatal(err)
		}
		r := run(t, "migrate", "--database-url", jobstest.DatabaseURL(), "--schema", schema, "--config", file,
			"--redis-url", "127.0.0.1:6379", "--stall-timeout", "1m", "--metrics-addr", "nowhere", "--page-size", "1")
		requireExit(t, r, exitOK)
		var n int
		if err := conn.QueryRow(t.Context(), `SELECT count(*) FROM information_schema.tables
WHERE table_schema = $1 AND table_name = 'jobs'`, schema).Scan(&n); err != nil || n != 1 {
			t.Fatalf("jobs table in %s: %d (%v)", schema, n, err)
		}
	})

	t.Run("StillChecksWhatItUses", func(t *testing.T) {
		t.Parallel()
		r := run(t, "migrate", "--database-url", jobstest.DatabaseURL(), "--schema", "my-schema", "--redis-url", "127.0.0.1:6379")
		requireExit(t, r, exitCannotRun)
		requireOneLineError(t, r, `schema "my-schema" is not a plain PostgreSQL identifier`, "(from flag --schema)")
		if strings.Contains(r.stderr, "redis_url") {
			t.Fatalf("migrate reported the daemon's redis_url: %q", r.stderr)
		}
	})

	t.Run("RefusesAnUnknownKeyOfTheFile", func(t *testing.T) {
		t.Parallel()
		file := filepath.Join(t.TempDir(), "jobreaper.yaml")
		if err := os.WriteFile(file, []byte("shema: jr\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		r := run(t, "migrate", "--database-url", jobstest.DatabaseURL(), "--config", file)
		requireExit(t, r, exitCannotRun)
		requireOneLineError(t, r, "config file "+file+` line 1: unknown key "shema" (did you mean "schema"?)`)
	})
}

// Not parallel: it empties an environment variable the command reads (an
// empty variable counts as unset), whatever the machine has set.
func TestMigrateRequiresADatabaseURL(t *testing.T) {
	t.Setenv("JOBREAPER_DATABASE_URL", "")
	t.Setenv("JOBREAPER_CONFIG", "")
	r := run(t, "migrate")
	requireExit(t, r, exitCannotRun)
	requireOneLineError(t, r, "database_url is required")
}
