package pgstore

import (
	"context"
	"reflect"
	"testing"

	"github.com/jobreaper/jobreaper/internal/pgcore"
)

// FuzzCascadeRewrite holds the two ways a cascade statement's named
// arguments are bound to each other and to Validate: for any statement
// that Validate accepts, the set-based reap's rewrite to positions, made
// once per batch (rewriteCascade, positionalCascade.args), must succeed and
// give exactly the SQL text and the argument values of pgx's own named
// rewrite that Fail, Complete and PrepareCascades use. A statement whose
// rewrite fails must be one that Validate refuses, or the daemon would
// start and then fail every reap of that type.
func FuzzCascadeRewrite(f *testing.F) {
	for _, sql := range []string{
		`UPDATE parents SET failed = failed + 1 WHERE id = @parent_id`,
		`INSERT INTO log (job_id, parent_id, tenant_id, type) VALUES (@job_id, @parent_id, @tenant_id, @type)`,
		`UPDATE t SET n = n + 1 WHERE id = @job_id AND owner = @job_id`,
		`SELECT '@job_id', "@parent_id", $$@type$$, E'\'@x' -- @unknown`,
		`SELECT 1 /* @a /* @b */ @c */ WHERE @tenant_id IS NULL`,
		`SELECT x @> y, a@@to_tsquery('b') FROM t WHERE k = @type`,
		`UPDATE parents SET failed = failed + 1 WHERE id = @parent`,
		`SELECT @job_idx, @_private, @JOB_ID`,
		"SELECT @job_id \xff @unknown",
		`SELECT $tag$ @x $tag$, a$b@job_id`,
		``,
	} {
		f.Add(sql, "J1", "type.a", "P1", "")
	}
	f.Add(`SELECT @job_id, @parent_id`, `it's "quoted" {braces} with spaces`, "t", "", "tenant-日本")
	f.Fuzz(func(t *testing.T, sql, jobID, typ, parentID, tenantID string) {
		validateErr := pgcore.Cascades{"t": {OnFailed: []string{sql}}}.Validate()
		pc, rewriteErr := rewriteCascade(context.Background(), sql)
		if rewriteErr != nil {
			if validateErr == nil {
				t.Fatalf("Validate accepts %q, but the reap's rewrite fails: %v", sql, rewriteErr)
			}
			return
		}
		a := pgcore.CascadeArgs{JobID: jobID, Type: typ, ParentID: parentID, TenantID: tenantID}
		wantSQL, wantArgs, err := a.Named().RewriteQuery(context.Background(), nil, sql, nil)
		if err != nil {
			t.Fatalf("pgx's named rewrite of %q fails: %v", sql, err)
		}
		if pc.sql != wantSQL {
			t.Fatalf("statement %q: the reap binds\n%q\nbut Fail and Complete bind\n%q", sql, pc.sql, wantSQL)
		}
		if got := pc.args(a); !reflect.DeepEqual(got, wantArgs) {
			t.Fatalf("statement %q: the reap passes %#v, Fail and Complete pass %#v", sql, got, wantArgs)
		}
	})
}
