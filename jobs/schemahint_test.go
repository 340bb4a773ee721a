package jobs_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
)

// hintDB is a database of its own (the shared one holds a schema per test)
// whose public schema holds a product's own jobs table, with jobreaper
// migrated into each of schemas.
func hintDB(t *testing.T, schemas ...string) *pgxpool.Pool {
	t.Helper()
	ctx := context.Background()
	_, url := jobstest.NewDatabase(t)
	pool, err := jobs.Connect(ctx, url, "public")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if _, err := pool.Exec(ctx, `CREATE TABLE public.jobs (id bigint PRIMARY KEY, payload text)`); err != nil {
		t.Fatal(err)
	}
	for _, s := range schemas {
		if _, err := jobs.Migrate(ctx, pool, s); err != nil {
			t.Fatal(err)
		}
	}
	return pool
}

// checkSchemaErr returns CheckSchema's error for schema, which must be
// ErrNotMigrated.
func checkSchemaErr(t *testing.T, pool *pgxpool.Pool, schema string) string {
	t.Helper()
	err := jobs.NewStore(pool, jobs.WithSchema(schema)).CheckSchema(context.Background())
	if !errors.Is(err, jobs.ErrNotMigrated) {
		t.Fatalf("CheckSchema(%s) = %v, want ErrNotMigrated", schema, err)
	}
	return err.Error()
}

// A wrong schema name is answered with the schema of the same database
// that holds jobreaper's tables before the command that would migrate the
// wrong name.
func TestCheckSchemaSuggestsTheSchemaThatHoldsJobreapersTables(t *testing.T) {
	t.Parallel()

	t.Run("ATypoIsAskedAboutBeforeMigratingIt", func(t *testing.T) {
		t.Parallel()
		msg := checkSchemaErr(t, hintDB(t, "jobreaper"), "jobrepaer")
		hint := `schema "jobrepaer" has no jobreaper tables (this binary ships version `
		ask := `; schema "jobreaper" of this database holds them: did you mean --schema jobreaper? If not, run ` + "`jobreaper migrate --schema jobrepaer`"
		if !strings.Contains(msg, hint) || !strings.Contains(msg, ask) {
			t.Fatalf("error %q\nwant %q ... %q", msg, hint, ask)
		}
	})

	t.Run("TheProductsSchemaIsAnsweredWithJobreapersOwn", func(t *testing.T) {
		t.Parallel()
		msg := checkSchemaErr(t, hintDB(t, "jobreaper"), "public")
		want := `schema "public" holds tables named like jobreaper's (jobs) that jobreaper did not create; schema "jobreaper" of this database holds jobreaper's: did you mean --schema jobreaper (JOBREAPER_SCHEMA)?`
		if !strings.HasPrefix(strings.TrimPrefix(msg, "jobs.CheckSchema: "), want) {
			t.Fatalf("error %q\nwant it to start %q", msg, want)
		}
	})

	t.Run("OfSeveralSchemasOnlyANearNameIsSuggested", func(t *testing.T) {
		t.Parallel()
		pool := hintDB(t, "reaper_eu", "reaper_us")
		if msg := checkSchemaErr(t, pool, "reapr_us"); !strings.Contains(msg, "did you mean --schema reaper_us?") {
			t.Fatalf("error %q does not suggest reaper_us", msg)
		}
		msg := checkSchemaErr(t, pool, "billing")
		if strings.Contains(msg, "did you mean") || !strings.Contains(msg, "run `jobreaper migrate --schema billing` with the same database URL, or correct the schema name") {
			t.Fatalf("error %q: no schema is near billing, so the migrate hint stands alone", msg)
		}
	})

	t.Run("NoOtherSchemaLeavesTheMigrateHint", func(t *testing.T) {
		t.Parallel()
		msg := checkSchemaErr(t, hintDB(t), "jobreaper")
		if strings.Contains(msg, "did you mean") || !strings.Contains(msg, "run `jobreaper migrate --schema jobreaper`") {
			t.Fatalf("error %q", msg)
		}
	})
}
