package jobs_test

import (
	"context"
	"strings"
	"testing"

	"github.com/jobreaper/jobreaper/jobs"
)

func TestCascadesValidate(t *testing.T) {
	t.Parallel()

	t.Run("KnownArgumentsOperatorsStringsAndCommentsPass", func(t *testing.T) {
		t.Parallel()
		c := jobs.Cascades{"video.transcode": {
			OnFailed: []string{
				`UPDATE parents SET failed = failed + 1 WHERE id = @parent_id AND tenant = @tenant_id`,
				`INSERT INTO notes VALUES (@job_id, @type, 'mail me @home') -- or @nobody`,
				`UPDATE docs SET x = 1 WHERE meta @> '{"a": 1}' AND id = @job_id /* @ignored */`,
			},
			OnCompleted: []string{`UPDATE parents SET pending = pending - 1 WHERE id = @parent_id`},
		}}
		requireNoErr(t, c.Validate())
	})

	t.Run("EmptyStatementsAndUnknownArgumentsNameTypeHookAndStatement", func(t *testing.T) {
		t.Parallel()
		c := jobs.Cascades{
			"report.export": {OnFailed: []string{`SELECT 1`, "  "}},
			"video.transcode": {OnCompleted: []string{
				`UPDATE parents SET pending = pending - 1 WHERE id = @parent_id`,
				`UPDATE parents SET pending = pending - 1 WHERE id = @parentid OR id = @jobid OR id = @parentid`,
			}},
		}
		err := c.Validate()
		requireIs(t, err, jobs.ErrBadCascade)
		for _, want := range []string{
			`cascade on_failed of type "report.export", statement 2 is empty`,
			`cascade on_completed of type "video.transcode", statement 2 uses @parentid, @jobid; only @job_id, @parent_id, @tenant_id, @type are available`,
		} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("error %q\nlacks %q", err, want)
			}
		}
	})
}

// A statement PostgreSQL cannot take as text (invalid UTF-8, a NUL byte)
// is refused by Validate, naming it: pgx's rewrite reads a named argument
// up to and including the first invalid byte ("@A\xc9" is the argument
// "A\xc9"), so such a statement passed Validate and then failed every reap
// of its type at binding (found by FuzzCascadeRewrite).
func TestCascadesValidateRefusesTextPostgreSQLCannotTake(t *testing.T) {
	t.Parallel()
	for name, sql := range map[string]string{
		"InvalidUTF8AfterANamedArgument": "UPDATE parents SET n = n + 1 WHERE id = @parent_id\xc9",
		"InvalidUTF8Alone":               "UPDATE parents SET n = n + 1 WHERE id = '\xff'",
		"NulByte":                        "UPDATE parents SET n = n + 1\x00 WHERE id = @parent_id",
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			err := jobs.Cascades{"report.export": {OnFailed: []string{"SELECT 1", sql}}}.Validate()
			requireIs(t, err, jobs.ErrBadCascade)
			if want := `cascade on_failed of type "report.export", statement 2 is not valid UTF-8 without NUL bytes`; !strings.Contains(err.Error(), want) {
				t.Fatalf("error %q\nlacks %q", err, want)
			}
		})
	}
}

func TestPrepareCascades(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("StatementsThatPlanAgainstTheDatabasePass", func(t *testing.T) {
		t.Parallel()
		db, _ := setup(t, nil)
		db.Exec(t, `CREATE TABLE parents (id text PRIMARY KEY, pending int NOT NULL, tenant text)`)
		store := db.Store(jobs.WithCascades(jobs.Cascades{"video.transcode": {
			OnFailed:    []string{`UPDATE parents SET pending = pending - 1 WHERE id = @parent_id AND tenant = @tenant_id`},
			OnCompleted: []string{`INSERT INTO job_events (job_id, kind, detail) VALUES (@job_id, 'note', jsonb_build_object('type', @type::text))`},
		}}))
		requireNoErr(t, store.PrepareCascades(ctx))
		requireCount(t, db, 0, `SELECT count(*) FROM job_events WHERE kind = 'note'`)
	})

	t.Run("TyposFailAtStartNamingTheTypeHookAndStatement", func(t *testing.T) {
		t.Parallel()
		db, _ := setup(t, nil)
		db.Exec(t, `CREATE TABLE parents (id text PRIMARY KEY, pending int NOT NULL)`)
		store := db.Store(jobs.WithCascades(jobs.Cascades{
			"video.transcode": {OnCompleted: []string{
				`UPDATE parents SET pending = pending - 1 WHERE id = @parent_id`,
				`UPDATE parent SET pending = pending - 1 WHERE id = @parent_id`,
				`UPDATE parents SET pendng = 0 WHERE id = @parent_id`,
			}},
			"report.export": {OnFailed: []string{`UPDATE parents SET pending = 0 WHERE id = @parent_id; SELECT 1`}},
		}))
		err := store.PrepareCascades(ctx)
		requireIs(t, err, jobs.ErrBadCascade)
		for _, want := range []string{
			`cascade on_completed of type "video.transcode", statement 2 does not prepare`,
			`relation "parent" does not exist`,
			`cascade on_completed of type "video.transcode", statement 3 does not prepare`,
			`column "pendng" of relation "parents" does not exist`,
			`cascade on_failed of type "report.export", statement 1 does not prepare`,
		} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("error %q\nlacks %q", err, want)
			}
		}
		if strings.Contains(err.Error(), `type "video.transcode", statement 1`) {
			t.Errorf("the valid statement 1 of video.transcode was reported: %v", err)
		}
		t.Log(err)
	})

	t.Run("ValidationRunsFirst", func(t *testing.T) {
		t.Parallel()
		store := jobs.NewStore(nil, jobs.WithCascades(jobs.Cascades{"x": {OnFailed: []string{""}}}))
		err := store.PrepareCascades(ctx)
		requireIs(t, err, jobs.ErrBadCascade)
		if !strings.Contains(err.Error(), `cascade on_failed of type "x", statement 1 is empty`) {
			t.Fatalf("err = %v", err)
		}
	})
}
