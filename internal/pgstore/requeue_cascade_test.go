package pgstore_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/jobreaper/jobreaper/internal/pgstore"
	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
)

// parentsCascade is a product whose parent row records a failed child
// (on_failed) and is reset when the child runs again (on_requeued).
func parentsCascade(onRequeued ...string) jobs.Cascades {
	return jobs.Cascades{"report.export": {
		OnFailed:   []string{`UPDATE parents SET status = 'FAILED', failed_child = @job_id WHERE id = @parent_id`},
		OnRequeued: onRequeued,
	}}
}

func TestRequeueRunsTheOnRequeuedCascade(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("ResetsTheProductsStatusInTheRequeuesTransaction", func(t *testing.T) {
		t.Parallel()
		db, _ := setup(t, nil)
		db.Exec(t, `CREATE TABLE parents (id text PRIMARY KEY, status text NOT NULL, failed_child text, tenant text)`)
		db.Exec(t, `INSERT INTO parents VALUES ('P1', 'FAILED', 'J1', NULL), ('P2', 'FAILED', 'J9', NULL)`)
		store := stores(db, parentsCascade(
			`UPDATE parents SET status = 'RUNNING', failed_child = NULL, tenant = @tenant_id WHERE id = @parent_id AND failed_child = @job_id AND @type = 'report.export'`))
		requireNoErr(t, store.PrepareCascades(ctx))
		db.Insert(t, jobstest.Job{ID: "J1", Type: "report.export", Status: jobs.StatusFailed, Generation: 1, ParentID: "P1", TenantID: "T1"})

		gen, err := store.Requeue(ctx, pgstore.RequeueParams{JobID: "J1", Status: jobs.StatusFailed, Generation: 1, Reason: "upstream fixed"})
		requireNoErr(t, err)
		if gen != 2 {
			t.Fatalf("generation = %d, want 2", gen)
		}
		requireRow(t, db, "J1", jobs.StatusQueued, 2, 0)
		requireCount(t, db, 1, `SELECT count(*) FROM parents WHERE id = 'P1' AND status = 'RUNNING' AND failed_child IS NULL AND tenant = 'T1'`)
		requireCount(t, db, 1, `SELECT count(*) FROM parents WHERE id = 'P2' AND status = 'FAILED'`)
	})

	t.Run("AFailingStatementLeavesTheJobAndTheProductAsTheyWere", func(t *testing.T) {
		t.Parallel()
		db, _ := setup(t, nil)
		db.Exec(t, `CREATE TABLE parents (id text PRIMARY KEY, status text NOT NULL CHECK (status <> 'BROKEN'), failed_child text, tenant text)`)
		db.Exec(t, `INSERT INTO parents VALUES ('P1', 'FAILED', 'J1', NULL)`)
		store := stores(db, parentsCascade(
			`UPDATE parents SET failed_child = NULL WHERE id = @parent_id`,
			`UPDATE parents SET status = 'BROKEN' WHERE id = @parent_id`))
		db.Insert(t, jobstest.Job{ID: "J1", Type: "report.export", Status: jobs.StatusFailed, Generation: 1, ParentID: "P1"})

		_, err := store.Requeue(ctx, pgstore.RequeueParams{JobID: "J1", Status: jobs.StatusFailed, Generation: 1, Reason: "try"})
		if err == nil || !strings.Contains(err.Error(), `cascade on_requeued of type "report.export", statement 2`) {
			t.Fatalf("err = %v, want the failing on_requeued statement named", err)
		}
		requireRow(t, db, "J1", jobs.StatusFailed, 1, 0)
		requireCount(t, db, 0, `SELECT count(*) FROM job_events WHERE job_id = 'J1' AND kind = 'requeued'`)
		requireCount(t, db, 1, `SELECT count(*) FROM parents WHERE id = 'P1' AND status = 'FAILED' AND failed_child = 'J1'`)
	})

	t.Run("PrepareCascadesNamesAMisspeltOnRequeuedStatement", func(t *testing.T) {
		t.Parallel()
		db, _ := setup(t, nil)
		db.Exec(t, `CREATE TABLE parents (id text PRIMARY KEY, status text NOT NULL, failed_child text)`)
		store := stores(db, parentsCascade(`UPDATE parent SET status = 'RUNNING' WHERE id = @parent_id`))
		err := store.PrepareCascades(ctx)
		requireIs(t, err, jobs.ErrBadCascade)
		if !strings.Contains(err.Error(), `cascade on_requeued of type "report.export", statement 1 does not prepare`) ||
			!strings.Contains(err.Error(), `relation "parent" does not exist`) {
			t.Fatalf("err = %v", err)
		}
	})

	t.Run("ValidateNamesAnUnknownArgumentOfOnRequeued", func(t *testing.T) {
		t.Parallel()
		err := jobs.Cascades{"report.export": {OnRequeued: []string{`UPDATE parents SET status = 'RUNNING' WHERE id = @parent`}}}.Validate()
		requireIs(t, err, jobs.ErrBadCascade)
		if !strings.Contains(err.Error(), `cascade on_requeued of type "report.export", statement 1 uses @parent`) {
			t.Fatalf("err = %v", err)
		}
	})
}

// The digest replicas compare for settings drift hashes the cascades' JSON
// form: cascades without on_requeued must keep the form earlier versions
// hashed, so that upgrading one replica of a fleet that does not use the
// hook shows no drift.
func TestCascadesJSONFormWithoutOnRequeuedIsUnchanged(t *testing.T) {
	t.Parallel()
	c := jobs.Cascades{"report.export": {OnFailed: []string{"SELECT 1"}}}
	b, err := json.Marshal(c)
	requireNoErr(t, err)
	if want := `{"report.export":{"OnFailed":["SELECT 1"],"OnCompleted":null}}`; string(b) != want {
		t.Fatalf("JSON form = %s, want %s", b, want)
	}
	c["report.export"] = jobs.Cascade{OnFailed: []string{"SELECT 1"}, OnRequeued: []string{"SELECT 2"}}
	b, err = json.Marshal(c)
	requireNoErr(t, err)
	if want := `{"report.export":{"OnFailed":["SELECT 1"],"OnCompleted":null,"OnRequeued":["SELECT 2"]}}`; string(b) != want {
		t.Fatalf("JSON form with on_requeued = %s, want %s", b, want)
	}
}
