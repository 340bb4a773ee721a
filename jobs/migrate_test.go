package jobs_test

import (
	"context"
	"errors"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
)

func TestCheckMigrated(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("MigratedSchemaPasses", func(t *testing.T) {
		t.Parallel()
		db := jobstest.New(t)
		if err := checkMigrated(ctx, db.Pool, db.Schema); err != nil {
			t.Fatal(err)
		}
		applied, err := jobs.Migrate(ctx, db.Pool, db.Schema)
		if err != nil || len(applied) != 0 {
			t.Fatalf("second Migrate applied %v (err %v), want nothing", applied, err)
		}
	})

	t.Run("SchemaWithoutTablesIsNotMigrated", func(t *testing.T) {
		t.Parallel()
		db := jobstest.New(t)
		empty := db.Schema + "_empty"
		db.Exec(t, "CREATE SCHEMA "+pgx.Identifier{empty}.Sanitize())
		t.Cleanup(func() { db.Exec(t, "DROP SCHEMA "+pgx.Identifier{empty}.Sanitize()+" CASCADE") })
		err := checkMigrated(ctx, db.Pool, empty)
		if !errors.Is(err, jobs.ErrNotMigrated) || !strings.Contains(err.Error(), "has no jobreaper tables") {
			t.Fatalf("err = %v, want ErrNotMigrated saying the schema has no tables", err)
		}
	})

	t.Run("SchemaMissingTheLatestMigrationIsNotMigrated", func(t *testing.T) {
		t.Parallel()
		db := jobstest.New(t)
		db.Exec(t, `DELETE FROM jobreaper_schema_version WHERE version_id = (SELECT max(version_id) FROM jobreaper_schema_version)`)
		err := checkMigrated(ctx, db.Pool, db.Schema)
		if !errors.Is(err, jobs.ErrNotMigrated) || !strings.Contains(err.Error(), "this binary needs") {
			t.Fatalf("err = %v, want ErrNotMigrated naming the versions", err)
		}
	})
}

func TestStoreCheckSchema(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("MigratedSchemaPasses", func(t *testing.T) {
		t.Parallel()
		db := jobstest.New(t)
		if err := db.Store().CheckSchema(ctx); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("WrongSchemaNameIsRefusedNamingTheSchemaAndTheFix", func(t *testing.T) {
		t.Parallel()
		db := jobstest.New(t)
		wrong := db.Schema + "_typo"
		err := jobs.NewStore(db.Pool, jobs.WithSchema(wrong)).CheckSchema(ctx)
		if !errors.Is(err, jobs.ErrNotMigrated) {
			t.Fatalf("err = %v, want ErrNotMigrated", err)
		}
		for _, want := range []string{`schema "` + wrong + `" has no jobreaper tables`, "jobreaper migrate --schema " + wrong} {
			if !strings.Contains(err.Error(), want) {
				t.Fatalf("err = %q, want it to say %q", err, want)
			}
		}
	})

	t.Run("SchemaMissingOneTableNamesIt", func(t *testing.T) {
		t.Parallel()
		db := jobstest.New(t)
		db.Exec(t, "DROP TABLE "+db.Table("job_batches"))
		err := db.Store().CheckSchema(ctx)
		if !errors.Is(err, jobs.ErrNotMigrated) || !strings.Contains(err.Error(), "lacks jobreaper's tables job_batches;") {
			t.Fatalf("err = %v, want ErrNotMigrated naming job_batches", err)
		}
	})

	t.Run("MalformedNameIsErrBadSchema", func(t *testing.T) {
		t.Parallel()
		db := jobstest.New(t)
		err := jobs.NewStore(db.Pool, jobs.WithSchema(`x"; DROP TABLE jobs; --`)).CheckSchema(ctx)
		if !errors.Is(err, jobs.ErrBadSchema) {
			t.Fatalf("err = %v, want ErrBadSchema", err)
		}
		if db.Count(t, `SELECT count(*) FROM `+db.Table("jobs")) != 0 {
			t.Fatal("jobs table changed")
		}
	})
}

// Migrate puts every table, goose's record included, in the schema it is
// given even when the connection's search_path names only public: it sets
// its own search_path inside each migration's transaction.
func TestMigrateIgnoresTheConnectionsSearchPath(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema := jobstest.SchemaName(t)
	pool, err := jobs.Connect(ctx, jobstest.DatabaseURL(), schema) // search_path: the server's default
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
		pool.Close()
	})
	var current string
	if err := pool.QueryRow(ctx, `SELECT current_schema()`).Scan(&current); err != nil || current != "public" {
		t.Fatalf("current_schema() = %q (err %v), want public: the test needs a connection without the schema on its path", current, err)
	}
	applied, err := jobs.Migrate(ctx, pool, schema)
	if want := shippedVersions(t); err != nil || !slices.Equal(applied, want) {
		t.Fatalf("Migrate applied %v (err %v), want every version shipped, in order: %v", applied, err, want)
	}
	for _, table := range []string{"jobs", "job_types", "job_events", "job_batches", "job_past_lives", jobs.SchemaVersionTable} {
		var inSchema, inPublic bool
		if err := pool.QueryRow(ctx, `SELECT to_regclass(format('%I.%I', $1::text, $2::text)) IS NOT NULL,
       to_regclass(format('public.%I', $2::text)) IS NOT NULL`, schema, table).Scan(&inSchema, &inPublic); err != nil {
			t.Fatal(err)
		}
		if !inSchema || inPublic {
			t.Errorf("table %s: in %s = %v (want true), in public = %v (want false)", table, schema, inSchema, inPublic)
		}
	}
	if err := checkMigrated(ctx, pool, schema); err != nil {
		t.Fatalf("CheckMigrated after Migrate: %v", err)
	}
	again, err := jobs.Migrate(ctx, pool, schema)
	if err != nil || len(again) != 0 {
		t.Fatalf("second Migrate applied %v (err %v), want nothing", again, err)
	}
}

// shippedVersions returns the versions of the migration files, in order
// (they need not be consecutive: a number may be left to work merged
// later).
func shippedVersions(t *testing.T) []int64 {
	t.Helper()
	files, err := filepath.Glob("migrations/*.sql")
	if err != nil || len(files) == 0 {
		t.Fatalf("no migration files (%v)", err)
	}
	var out []int64
	for _, f := range files {
		v, err := strconv.ParseInt(strings.SplitN(filepath.Base(f), "_", 2)[0], 10, 64)
		if err != nil {
			t.Fatalf("migration %s: %v", f, err)
		}
		out = append(out, v)
	}
	slices.Sort(out)
	return out
}

// A system schema is refused before anything connects or is created.
func TestMigrateRefusesPostgreSQLsOwnSchemas(t *testing.T) {
	t.Parallel()
	for _, schema := range []string{"information_schema", "pg_catalog", "PG_toast"} {
		_, err := jobs.Migrate(context.Background(), nil, schema)
		if !errors.Is(err, jobs.ErrBadSchema) || !strings.Contains(err.Error(), "PostgreSQL's own") {
			t.Fatalf("Migrate(%q) = %v, want ErrBadSchema naming it PostgreSQL's own", schema, err)
		}
	}
}
