package main

import (
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/jobreaper/jobreaper/jobs/jobstest"
)

// A database whose product already has a jobs table (and job_events) in
// the target schema: migrate refuses before it changes anything, names
// the tables and suggests a schema of jobreaper's own; with that schema
// it then succeeds next to the product's tables.
func TestMigrateNextToAProductsOwnJobsTable(t *testing.T) {
	t.Parallel()
	product, conn := freshSchema(t)
	q := pgx.Identifier{product}.Sanitize()
	for _, stmt := range []string{
		"CREATE SCHEMA " + q,
		"CREATE TABLE " + q + ".jobs (id bigserial PRIMARY KEY, title text NOT NULL)",
		"CREATE TABLE " + q + ".job_events (id bigserial PRIMARY KEY, note text)",
		"INSERT INTO " + q + ".jobs (title) VALUES ('the product''s row')",
	} {
		if _, err := conn.Exec(t.Context(), stmt); err != nil {
			t.Fatal(err)
		}
	}

	r := run(t, "migrate", "--database-url", jobstest.DatabaseURL(), "--schema", product)
	requireExit(t, r, exitCannotRun)
	requireOneLineError(t, r, `schema "`+product+`" already has job_events, jobs `,
		"nothing was changed", "--schema jobreaper")

	var tables []string
	rows, err := conn.Query(t.Context(), `SELECT table_name::text FROM information_schema.tables
WHERE table_schema = $1 ORDER BY 1`, product)
	if err != nil {
		t.Fatal(err)
	}
	if tables, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
		t.Fatal(err)
	}
	if strings.Join(tables, ",") != "job_events,jobs" {
		t.Fatalf("tables in %s after the refused migrate: %v, want only the product's job_events,jobs", product, tables)
	}
	var title string
	if err := conn.QueryRow(t.Context(), "SELECT title FROM "+q+".jobs").Scan(&title); err != nil || title != "the product's row" {
		t.Fatalf("product row: %q (%v)", title, err)
	}

	own, _ := freshSchema(t)
	ok := run(t, "migrate", "--database-url", jobstest.DatabaseURL(), "--schema", own)
	requireExit(t, ok, exitOK)
	check := run(t, "run", "--once", "--database-url", jobstest.DatabaseURL(), "--schema", own,
		"--redis-url", redisTestURL(), "--queues", "adopt-"+own)
	requireExit(t, check, exitOK)
}
