package jobs_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net/url"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
)

// The daemon's least-privilege role may run migrate at every start (the
// systemd unit's ExecStartPre, the Kubernetes init container): on a
// current schema it changes nothing and needs no CREATE privilege. With a
// migration pending, the refusal says which role migrate needs.
func TestMigrateAsARoleThatCannotCreate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := jobstest.New(t)
	var b [4]byte
	_, _ = rand.Read(b[:])
	role := "jr_test_nocreate_" + hex.EncodeToString(b[:])
	ident := pgx.Identifier{role}.Sanitize()
	schema := pgx.Identifier{db.Schema}.Sanitize()
	db.Exec(t, "CREATE ROLE "+ident+" LOGIN")
	t.Cleanup(func() {
		admin, err := pgx.Connect(context.Background(), jobstest.DatabaseURL())
		if err != nil {
			t.Errorf("dropping role %s: %v", role, err)
			return
		}
		defer admin.Close(context.Background())
		for _, sql := range []string{"DROP OWNED BY " + ident, "DROP ROLE " + ident} {
			if _, err := admin.Exec(context.Background(), sql); err != nil {
				t.Errorf("%s: %v", sql, err)
			}
		}
	})
	db.Exec(t, "GRANT USAGE ON SCHEMA "+schema+" TO "+ident)
	db.Exec(t, "GRANT SELECT ON ALL TABLES IN SCHEMA "+schema+" TO "+ident)

	u, err := url.Parse(jobstest.DatabaseURL())
	requireNoErr(t, err)
	u.User = url.User(role)
	pool, err := jobs.Connect(ctx, u.String(), db.Schema)
	requireNoErr(t, err)
	defer pool.Close()

	applied, err := jobs.Migrate(ctx, pool, db.Schema)
	if err != nil || len(applied) != 0 {
		t.Fatalf("migrate of a current schema as %s = %v, %v; want nothing applied and no error", role, applied, err)
	}

	// A schema an older release left at version 1: its pending
	// migrations need CREATE, which the role lacks.
	old := db.Schema + "_v1"
	requireNoErr(t, jobs.MigrateUpTo(ctx, db.Pool, old, 1))
	t.Cleanup(func() { db.Exec(t, "DROP SCHEMA "+pgx.Identifier{old}.Sanitize()+" CASCADE") })
	db.Exec(t, "GRANT USAGE ON SCHEMA "+pgx.Identifier{old}.Sanitize()+" TO "+ident)
	db.Exec(t, "GRANT SELECT ON ALL TABLES IN SCHEMA "+pgx.Identifier{old}.Sanitize()+" TO "+ident)
	_, err = jobs.Migrate(ctx, pool, old)
	if err == nil || !strings.Contains(err.Error(), "migrate needs a role that may create") {
		t.Fatalf("migrate with pending migrations as %s: err = %v, want the privilege hint", role, err)
	}
}

// A schema holding a product's own table named like one of jobreaper's
// is not jobreaper's to migrate: the start-up check says to give
// jobreaper a schema of its own instead of suggesting a migrate that
// would be refused.
func TestStartUpCheckOnAProductsOwnJobsTableSuggestsASchemaOfItsOwn(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := jobstest.New(t)
	product := db.Schema + "_product"
	db.Exec(t, "CREATE SCHEMA "+pgx.Identifier{product}.Sanitize())
	t.Cleanup(func() { db.Exec(t, "DROP SCHEMA "+pgx.Identifier{product}.Sanitize()+" CASCADE") })
	db.Exec(t, "CREATE TABLE "+pgx.Identifier{product, "jobs"}.Sanitize()+" (id bigint PRIMARY KEY, title text)")

	err := checkMigrated(ctx, db.Pool, product)
	if !errors.Is(err, jobs.ErrNotMigrated) || !strings.Contains(err.Error(), "(jobs) that jobreaper did not create") ||
		!strings.Contains(err.Error(), "--schema jobreaper") || strings.Contains(err.Error(), "--schema "+product) {
		t.Fatalf("err = %v, want ErrNotMigrated naming the jobs table and suggesting a schema of jobreaper's own", err)
	}
}
