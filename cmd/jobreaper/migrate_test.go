package main

import (
	"context"
	"os"
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

func TestMigrate(t *testing.T) {
	t.Parallel()

	t.Run("CreatesTheTablesAndASecondRunAppliesNothing", func(t *testing.T) {
		t.Parallel()
		schema, conn := freshSchema(t)

		first := run(t, "migrate", "--database-url", jobstest.DatabaseURL(), "--schema", schema)
		requireExit(t, first, exitOK)
		if !strings.Contains(first.stdout, `applied 1 migration(s) to schema "`+schema+`": 1`) {
			t.Fatalf("first run printed %q", first.stdout)
		}
		var tables []string
		rows, err := conn.Query(t.Context(), `SELECT table_name::text FROM information_schema.tables
WHERE table_schema = $1 AND table_name IN ('job_types', 'jobs', 'job_events', 'job_batches') ORDER BY 1`, schema)
		if err != nil {
			t.Fatal(err)
		}
		if tables, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
			t.Fatal(err)
		}
		if strings.Join(tables, ",") != "job_batches,job_events,job_types,jobs" {
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

	t.Run("RequiresADatabaseURL", func(t *testing.T) {
		t.Parallel()
		if _, set := os.LookupEnv("JOBREAPER_DATABASE_URL"); set {
			t.Skip("JOBREAPER_DATABASE_URL is set in this environment")
		}
		r := run(t, "migrate")
		requireExit(t, r, exitCannotRun)
		requireOneLineError(t, r, "database_url is required")
	})
}
