package jobs_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/jobreaper/jobreaper/internal/pgstore"
	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
)

// cascadeLogSQL records what a cascade statement was given.
const cascadeLogSQL = `INSERT INTO cascade_log (hook, job_id, parent_id, tenant_id, type, both_ids)
VALUES ('%s', @job_id, @parent_id, @tenant_id, @type, @job_id || '|' || coalesce(@parent_id, '-'))`

// FuzzCascadeArgumentsRoundTrip runs a job whose ID, type, parent and
// tenant hold anything a text column can (quotes, braces, spaces,
// non-ASCII, 1 KB) through the three paths that run a cascade, on real
// PostgreSQL: the set-based reap (arguments bound by position once per
// batch), Fail and Complete (pgx's named arguments). Each cascade
// statement must see exactly the row's values (an empty parent or tenant
// as NULL), whatever they hold: a value is always a parameter, never SQL.
func FuzzCascadeArgumentsRoundTrip(f *testing.F) {
	for _, s := range [][4]string{
		{"J1", "report.export", "P1", "T1"},
		{"J2", "report.export", "", ""},
		{`it's "quoted"`, `type'; DROP TABLE jobs; --`, `{"parent": [1]}`, "with spaces"},
		{"rapport-été-日本", "vidéo.transcode", "parent-ü", "tenant-🙂"},
		{strings.Repeat("x", jobs.MaxIDLength), strings.Repeat("t", 300), strings.Repeat("p", 1000), "@job_id"},
		{"$1", "@type", "%s", `\x00`},
	} {
		f.Add(s[0], s[1], s[2], s[3])
	}
	db := jobstest.New(f)
	db.Exec(f, `CREATE TABLE cascade_log (hook text, job_id text, parent_id text, tenant_id text, type text, both_ids text)`)
	f.Fuzz(func(t *testing.T, id, typ, parent, tenant string) {
		// What a text column holds: valid UTF-8 without NUL bytes; a job
		// ID also within jobs.MaxIDLength and not empty. Other values
		// are mapped, not skipped (the ID's own refusals are fuzzed in
		// FuzzGuardTaskData).
		text := func(s string) string { return strings.ReplaceAll(strings.ToValidUTF8(s, "?"), "\x00", "0") }
		id, typ, parent, tenant = text(id), text(typ), text(parent), text(tenant)
		if len(id) > jobs.MaxIDLength {
			id = strings.ToValidUTF8(id[:jobs.MaxIDLength], "")
		}
		if id == "" {
			id = "J"
		}
		if strings.TrimSpace(typ) == "" {
			typ = "t" + typ
		}
		for _, hook := range []string{"reap", "fail", "complete"} {
			checkCascadeArguments(t, db, hook, id, typ, parent, tenant)
		}
	})
}

func checkCascadeArguments(t *testing.T, db *jobstest.DB, hook, id, typ, parent, tenant string) {
	t.Helper()
	ctx := context.Background()
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	stmt := strings.Replace(cascadeLogSQL, "%s", hook, 1)
	store := jobs.NewStore(tx, jobs.WithSchema(db.Schema), jobs.WithCascades(jobs.Cascades{typ: {OnFailed: []string{stmt}, OnCompleted: []string{stmt}}}))
	if _, err := tx.Exec(ctx, `INSERT INTO job_types (name, max_runtime) VALUES ($1, '30 minutes')`, typ); err != nil {
		t.Fatal(err)
	}
	status := jobs.StatusQueued
	if hook == "reap" {
		status = jobs.StatusProcessing
	}
	if _, err := tx.Exec(ctx, `INSERT INTO jobs (id, type, status, generation, queue, parent_id, tenant_id, started_at, updated_at)
VALUES ($1, $2, $3, 1, 'q', nullif($4, ''), nullif($5, ''), now() - interval '31 minutes', now() - interval '21 minutes')`,
		id, typ, status, parent, tenant); err != nil {
		t.Fatalf("inserting job %q: %v", id, err)
	}
	switch hook {
	case "reap":
		reaped, _, err := jobs.DaemonOf(store).Reap(ctx, pgstore.ReapParams{JobID: id, Generation: 1, UpdatedAt: readUpdatedAt(t, tx, id),
			Reason: jobs.ReasonStalled, Rule: rule})
		if err != nil || !reaped {
			t.Fatalf("reaping %q: reaped %v, %v", id, reaped, err)
		}
	case "fail", "complete":
		lease, err := store.Claim(ctx, id, 1, "W1")
		if err != nil {
			t.Fatalf("claiming %q: %v", id, err)
		}
		if hook == "fail" {
			err = store.Fail(ctx, lease, "boom")
		} else {
			_, err = store.Complete(ctx, tx, lease)
		}
		if err != nil {
			t.Fatalf("%s of %q: %v", hook, id, err)
		}
	}
	rows, err := tx.Query(ctx, `SELECT job_id, parent_id, tenant_id, type, both_ids FROM cascade_log WHERE hook = $1`, hook)
	if err != nil {
		t.Fatal(err)
	}
	type seen struct {
		JobID, Type, Both string
		Parent, Tenant    *string
	}
	got, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (seen, error) {
		var s seen
		return s, r.Scan(&s.JobID, &s.Parent, &s.Tenant, &s.Type, &s.Both)
	})
	if err != nil {
		t.Fatal(err)
	}
	nullable := func(p *string) string {
		if p == nil {
			return ""
		}
		return *p
	}
	wantBoth := id + "|" + parent
	if parent == "" {
		wantBoth = id + "|-"
	}
	if len(got) != 1 || got[0].JobID != id || got[0].Type != typ || nullable(got[0].Parent) != parent ||
		nullable(got[0].Tenant) != tenant || (parent == "") != (got[0].Parent == nil) || (tenant == "") != (got[0].Tenant == nil) ||
		got[0].Both != wantBoth {
		t.Fatalf("%s cascade of job %q (type %q, parent %q, tenant %q) saw %+v", hook, id, typ, parent, tenant, got)
	}
}

func readUpdatedAt(t *testing.T, tx pgx.Tx, id string) time.Time {
	t.Helper()
	var at time.Time
	if err := tx.QueryRow(context.Background(), `SELECT updated_at FROM jobs WHERE id = $1`, id).Scan(&at); err != nil {
		t.Fatal(err)
	}
	return at
}
