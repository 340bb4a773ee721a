package jobs_test

import (
	"context"
	"errors"
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
		if err := jobs.CheckMigrated(ctx, db.Pool, db.Schema); err != nil {
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
		err := jobs.CheckMigrated(ctx, db.Pool, empty)
		if !errors.Is(err, jobs.ErrNotMigrated) || !strings.Contains(err.Error(), "has no jobreaper tables") {
			t.Fatalf("err = %v, want ErrNotMigrated saying the schema has no tables", err)
		}
	})

	t.Run("SchemaMissingTheLatestMigrationIsNotMigrated", func(t *testing.T) {
		t.Parallel()
		db := jobstest.New(t)
		db.Exec(t, `DELETE FROM jobreaper_schema_version WHERE version_id = (SELECT max(version_id) FROM jobreaper_schema_version)`)
		err := jobs.CheckMigrated(ctx, db.Pool, db.Schema)
		if !errors.Is(err, jobs.ErrNotMigrated) || !strings.Contains(err.Error(), "this binary needs") {
			t.Fatalf("err = %v, want ErrNotMigrated naming the versions", err)
		}
	})
}
