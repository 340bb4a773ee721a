package main

import (
	"context"
	"errors"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/jobreaper/jobreaper/internal/pgstore"
	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
	"github.com/jobreaper/jobreaper/queue"
	"github.com/jobreaper/jobreaper/queue/queuetest"
)

// roleURL is db's URL with user as its user.
func roleURL(t *testing.T, db *jobstest.DB, user string) string {
	t.Helper()
	u, err := url.Parse(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.User(user)
	return u.String()
}

// requireDenied fails unless running sql as conn is refused for lack of a
// privilege (SQLSTATE 42501).
func requireDenied(t *testing.T, conn *pgx.Conn, sql string) {
	t.Helper()
	_, err := conn.Exec(t.Context(), sql)
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "42501" {
		t.Fatalf("%s: err = %v, want permission denied (42501)", sql, err)
	}
}

// deploy/sql/roles.sql grants each role what it needs and nothing more: a
// full reaping pass with a cascade runs as the reaper role, and so does a
// pass that records a stall-storm hold and the pass that drains it; a
// worker's claim, heartbeat, advance and complete (with its cascade) run
// as the worker role; the operator commands (with their cascades, and
// release-hold) as the operator role; none can write what it does not own.
func TestRolesSQLGrantsWhatEachRoleNeeds(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("psql"); err != nil {
		t.Fatal("psql is not installed: apt-get install -y postgresql-client")
	}
	ctx := t.Context()
	db := jobstest.New(t)
	suffix := strings.TrimPrefix(unique(""), "-")
	reaperRole, workerRole, operatorRole := "jr_reaper_"+suffix, "jr_worker_"+suffix, "jr_operator_"+suffix
	t.Cleanup(func() {
		ctx := context.WithoutCancel(t.Context())
		for _, r := range []string{reaperRole, workerRole, operatorRole} {
			id := pgx.Identifier{r}.Sanitize()
			if _, err := db.Pool.Exec(ctx, `SELECT 1 FROM pg_roles WHERE rolname = $1`, r); err != nil {
				continue
			}
			_, _ = db.Pool.Exec(ctx, "DROP OWNED BY "+id)
			_, _ = db.Pool.Exec(ctx, "DROP ROLE IF EXISTS "+id)
		}
	})
	// As its header says: without operator_role (the earlier form of the
	// command), then again with it.
	for _, extra := range [][]string{nil, {"-v", "operator_role=" + operatorRole}} {
		args := append([]string{jobstest.DatabaseURL(), "-X", "-q", "-v", "ON_ERROR_STOP=1",
			"-v", "schema=" + db.Schema, "-v", "reaper_role=" + reaperRole, "-v", "worker_role=" + workerRole}, extra...)
		psql := exec.CommandContext(ctx, "psql", append(args, "-f", "../../deploy/sql/roles.sql")...)
		if out, err := psql.CombinedOutput(); err != nil {
			t.Fatalf("psql %v -f deploy/sql/roles.sql: %v\n%s", extra, err, out)
		}
		exists := db.Count(t, `SELECT count(*) FROM pg_roles WHERE rolname = $1`, operatorRole)
		if want := int64(len(extra) / 2); exists != want {
			t.Fatalf("with %v, %d operator roles exist, want %d", extra, exists, want)
		}
	}

	// The product's table and what its cascades add, as roles.sql says.
	s := pgx.Identifier{db.Schema}.Sanitize()
	db.JobType(t, "report.export", "30 minutes", "", "")
	db.Exec(t, `CREATE TABLE videos (id text PRIMARY KEY, status text NOT NULL, failed_child text, pending int NOT NULL, title text NOT NULL)`)
	db.Exec(t, `INSERT INTO videos VALUES ('V1', 'WAITING_CHILDREN', NULL, 1, 'first'), ('V2', 'WAITING_CHILDREN', NULL, 1, 'second'),
 ('V3', 'WAITING_CHILDREN', NULL, 1, 'third')`)
	db.Exec(t, `GRANT SELECT (id, status, pending, failed_child), UPDATE (status, failed_child, pending) ON videos TO `+
		pgx.Identifier{reaperRole}.Sanitize()+", "+pgx.Identifier{workerRole}.Sanitize()+", "+pgx.Identifier{operatorRole}.Sanitize())
	cascades := jobs.Cascades{"report.export": {
		OnFailed: []string{`UPDATE ` + s + `.videos SET status = 'FAILED', failed_child = @job_id
 WHERE id = @parent_id AND status = 'WAITING_CHILDREN'`},
		OnCompleted: []string{`UPDATE ` + s + `.videos SET pending = pending - 1 WHERE id = @parent_id`},
		OnRequeued:  []string{`UPDATE ` + s + `.videos SET status = 'WAITING_CHILDREN', failed_child = NULL WHERE id = @parent_id AND failed_child = @job_id`},
	}}
	file := filepath.Join(t.TempDir(), "jobreaper.yaml")
	quoted := func(sql string) string {
		return `"` + strings.ReplaceAll(strings.ReplaceAll(sql, `"`, `\"`), "\n", " ") + `"`
	}
	yaml := "cascades:\n  report.export:\n" +
		"    on_failed:\n      - " + quoted(cascades["report.export"].OnFailed[0]) + "\n" +
		"    on_completed:\n      - " + quoted(cascades["report.export"].OnCompleted[0]) + "\n" +
		"    on_requeued:\n      - " + quoted(cascades["report.export"].OnRequeued[0]) + "\n"
	if err := os.WriteFile(file, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}

	t.Run("ReaperRoleRunsAFullPassWithItsCascade", func(t *testing.T) {
		rdb := realRedis(t)
		q, id := unique("roles"), unique("Jreap")
		db.Insert(t, jobstest.Job{ID: id, Type: "report.export", Generation: 1, Queue: q, Worker: "W1", ParentID: "V1",
			StartedAgo: jobstest.Ago(31 * time.Minute), IdleAgo: 21 * time.Minute})
		activeTask(t, id, q)
		t.Cleanup(func() { rdb.Del(context.WithoutCancel(t.Context()), queue.MarkerKey(id)) })

		r := run(t, "run", "--once", "--output", "json", "--config", file, "--database-url", roleURL(t, db, reaperRole),
			"--schema", db.Schema, "--redis-url", redisTestURL(), "--queues", q)
		requireExit(t, r, exitOK)
		doc := requireOneJSONResult(t, r.stdout)
		if string(doc["reaped"]) != "1" || string(doc["errors"]) != "0" {
			t.Fatalf("pass as the reaper role: %s, want 1 reaped and no error", r.stdout)
		}
		if row := db.Read(t, id); row.Status != jobs.StatusFailed || row.FailureReason != jobs.ReasonStalled {
			t.Fatalf("row = %+v, want FAILED stalled", row)
		}
		if n := db.Count(t, `SELECT count(*) FROM videos WHERE id = 'V1' AND status = 'FAILED' AND failed_child = $1`, id); n != 1 {
			t.Fatal("the on_failed cascade did not fail video V1")
		}
		if n := db.Count(t, `SELECT count(*) FROM `+s+`.jobs WHERE id = $1 AND marker_set_at IS NOT NULL`, id); n != 1 {
			t.Fatal("marker_set_at was not recorded by the reaper role")
		}
		if n := db.Events(t, id, "reaped"); n != 1 {
			t.Fatalf("%d reaped events, want 1", n)
		}
	})

	t.Run("ReaperRoleRetryReaps", func(t *testing.T) {
		rdb := realRedis(t)
		typ := unique("report.retry")
		db.JobType(t, typ, "30 minutes", "", "")
		db.Exec(t, `UPDATE `+s+`.job_types SET reap_retries = 1 WHERE name = $1`, typ)
		q, id := unique("roles"), unique("Jretry")
		db.Insert(t, jobstest.Job{ID: id, Type: typ, Generation: 1, Queue: q, Worker: "W1",
			StartedAgo: jobstest.Ago(31 * time.Minute), IdleAgo: 21 * time.Minute})
		activeTask(t, id, q)
		t.Cleanup(func() { rdb.Del(context.WithoutCancel(t.Context()), queue.MarkerKey(id)) })

		r := run(t, "run", "--once", "--output", "json", "--config", file, "--database-url", roleURL(t, db, reaperRole),
			"--schema", db.Schema, "--redis-url", redisTestURL(), "--queues", q)
		// Exit 1 only for the first subtest's marker, whose re-assertion
		// is held (no live server in this Redis database).
		doc := requireOneJSONResult(t, r.stdout)
		if string(doc["reaped"]) != "1" || string(doc["errors"]) != "0" || !strings.Contains(string(doc["retried_by"]), `"stalled":1`) {
			t.Fatalf("pass as the reaper role: %s, want 1 retry reap and no error", r.stdout)
		}
		if n := db.Count(t, `SELECT count(*) FROM `+s+`.jobs WHERE id = $1 AND status = 'QUEUED' AND generation = 2 AND reap_count = 1
   AND finished_at IS NULL AND marker_set_at IS NULL`, id); n != 1 {
			t.Fatalf("row = %+v, want QUEUED at generation 2 with reap_count 1", db.Read(t, id))
		}
		if n := rdb.Exists(ctx, queue.MarkerKey(id)).Val(); n != 0 {
			t.Fatal("a retry reap wrote a marker")
		}
	})

	t.Run("ReaperRoleReadsAndRecordsTheOutageEnd", func(t *testing.T) {
		pool, err := jobs.Connect(ctx, roleURL(t, db, reaperRole), db.Schema)
		if err != nil {
			t.Fatal(err)
		}
		defer pool.Close()
		store := pgstore.New(pool, pgstore.WithSchema(db.Schema))
		p := pgstore.PassClockParams{Grace: true, Record: true, RecordedBy: "roles:1"}
		if c, err := store.PassClock(ctx, p); err != nil || c.Cause != "first_record" || c.TimelineRefused {
			t.Fatalf("the first pass's clock as the reaper role: %+v, %v", c, err)
		}
		// A restart since: the record is updated in place.
		db.Exec(t, `UPDATE `+s+`.reaper_outages SET postmaster_start = postmaster_start - interval '1 day'`)
		if c, err := store.PassClock(ctx, p); err != nil || c.Cause != "restart" {
			t.Fatalf("recording a restart as the reaper role: %+v, %v", c, err)
		}
	})

	t.Run("ReaperRoleHoldsAStallStormOperatorRoleReleasesIt", func(t *testing.T) {
		q := unique("roles-storm")
		ids := stormJobs(t, db, q, "report.export", 12)
		once := func(as string) result {
			return run(t, "run", "--once", "--output", "json", "--config", file, "--database-url", roleURL(t, db, as),
				"--schema", db.Schema, "--redis-url", redisTestURL(), "--queues", q)
		}
		r := once(reaperRole)
		requireExit(t, r, exitPassErrors)
		if doc := requireOneJSONResult(t, r.stdout); string(doc["stall_storm_held"]) != "12" || string(doc["errors"]) != "0" {
			t.Fatalf("storm pass as the reaper role: %s, want 12 held and no error", r.stdout)
		}
		r = run(t, "release-hold", "--reason", "checked: they hang", "--database-url", roleURL(t, db, operatorRole),
			"--schema", db.Schema, "--queues", q)
		requireExit(t, r, exitOK)
		// (Its exit code may be 1: the marker of the first subtest's job,
		// deleted at its cleanup, is held, since no asynq server runs.)
		r = once(reaperRole)
		if doc := requireOneJSONResult(t, r.stdout); string(doc["reaped"]) != "12" || string(doc["errors"]) != "0" ||
			string(doc["stall_storm_held"]) != "0" {
			t.Fatalf("first pass after the release, as the reaper role: %s, want the 12 reaped", r.stdout)
		}
		if n := db.Count(t, `SELECT count(*) FROM `+s+`.jobs WHERE id = ANY($1) AND status = 'FAILED'`, ids); n != 12 {
			t.Fatalf("%d of 12 FAILED", n)
		}
		if n := db.Count(t, `SELECT count(*) FROM `+s+`.reaper_holds WHERE released_by IS NOT NULL AND drained_at IS NOT NULL`); n != 1 {
			t.Fatal("the hold was not released and drained")
		}
	})

	t.Run("ReaperRoleTakesChecksAndReleasesItsLeaderLease", func(t *testing.T) {
		pool, err := jobs.Connect(ctx, roleURL(t, db, reaperRole), db.Schema)
		if err != nil {
			t.Fatal(err)
		}
		defer pool.Close()
		holder := pgstore.NewLeaderLeaseHolder(time.Now())
		key := pgstore.LeaderLeaseKey([]string{"default"})
		store := pgstore.New(pool, pgstore.WithSchema(db.Schema), pgstore.WithLeaderLease(key, holder.ID))
		st, err := store.AcquireLeaderLease(ctx, pgstore.LeaderLeaseParams{Key: key, Holder: holder, TTL: time.Minute})
		if err != nil || !st.Held {
			t.Fatalf("taking the leader lease as the reaper role: %+v, %v", st, err)
		}
		if st, err = store.AcquireLeaderLease(ctx, pgstore.LeaderLeaseParams{Key: key, Holder: holder, TTL: time.Minute}); err != nil || !st.Held {
			t.Fatalf("renewing it: %+v, %v", st, err)
		}
		// A reap transaction ends with the leader lease check.
		id := unique("Jlead")
		db.Insert(t, jobstest.Job{ID: id, Type: "report.export", Generation: 1, Queue: "default",
			StartedAgo: jobstest.Ago(31 * time.Minute), IdleAgo: 21 * time.Minute})
		sn, err := store.Get(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		out, err := store.ReapBatch(ctx, pgstore.ReapBatchParams{Reason: jobs.ReasonStalled,
			Rule:       pgstore.StallRule{DefaultStallTimeout: 15 * time.Minute, MinStallTimeout: 11 * time.Minute, DefaultHardTimeout: jobs.HardTimeoutDefault},
			Candidates: []pgstore.ReapCandidate{{JobID: id, Generation: sn.Generation, UpdatedAt: sn.UpdatedAt}}})
		if err != nil || len(out.Reaped) != 1 {
			t.Fatalf("a reap with the leader lease check as the reaper role: %+v, %v", out, err)
		}
		if err := store.ReleaseLeaderLease(ctx, key, holder.ID); err != nil {
			t.Fatalf("releasing it: %v", err)
		}
	})

	t.Run("WorkerRoleInsertsClaimsHeartbeatsAdvancesAndCompletes", func(t *testing.T) {
		pool, err := jobs.Connect(ctx, roleURL(t, db, workerRole), db.Schema)
		if err != nil {
			t.Fatal(err)
		}
		defer pool.Close()
		store := jobs.NewStore(pool, jobs.WithSchema(db.Schema), jobs.WithCascades(cascades))
		if err := store.CheckSchema(ctx); err != nil {
			t.Fatalf("CheckSchema as the worker role: %v", err)
		}
		if err := store.PrepareCascades(ctx); err != nil {
			t.Fatalf("PrepareCascades as the worker role: %v", err)
		}
		id := unique("Jwork")
		if _, err := pool.Exec(ctx, `INSERT INTO `+s+`.jobs (id, type, status, queue, parent_id) VALUES ($1, 'report.export', 'QUEUED', 'default', 'V2')`, id); err != nil {
			t.Fatalf("inserting a job row as the worker role: %v", err)
		}
		lease, err := store.Claim(ctx, id, 0, "W-roles")
		if err != nil {
			t.Fatalf("Claim: %v", err)
		}
		// The start guard's one-statement admission locks the row it reads.
		guarded := unique("Jguard")
		if _, err := pool.Exec(ctx, `INSERT INTO `+s+`.jobs (id, type, status, queue) VALUES ($1, 'report.export', 'QUEUED', 'default')`, guarded); err != nil {
			t.Fatalf("inserting a job row as the worker role: %v", err)
		}
		if adm, err := store.Admit(ctx, jobs.AdmitRequest{JobID: guarded, Worker: "W-roles", Claim: true}); err != nil || adm.Outcome != jobs.AdmitClaimed {
			t.Fatalf("Admit as the worker role: %+v, %v; want a claim", adm, err)
		}
		hb, err := jobs.NewHeartbeater(store, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		// The heartbeat's one UPDATE also keeps the attempt's longest
		// progress gap (max_idle_gap), which the worker role may write.
		db.Exec(t, `UPDATE `+s+`.jobs SET updated_at = now() - interval '3 minutes' WHERE id = $1`, id)
		if res, err := hb.Heartbeat(ctx, lease, 1); err != nil || !res.Written {
			t.Fatalf("Heartbeat: %+v, %v", res, err)
		}
		if n := db.Count(t, `SELECT count(*) FROM `+s+`.jobs WHERE id = $1 AND max_idle_gap >= interval '3 minutes'`, id); n != 1 {
			t.Fatal("the worker role's heartbeat did not keep max_idle_gap")
		}
		err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			_, err := store.Advance(ctx, tx, lease, "batch-1", 0, 5)
			return err
		})
		if err != nil {
			t.Fatalf("Advance: %v", err)
		}
		err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			_, err := store.Complete(ctx, tx, lease)
			return err
		})
		if err != nil {
			t.Fatalf("Complete: %v", err)
		}
		row := db.Read(t, id)
		if row.Status != jobs.StatusCompleted || row.Cursor != 5 || row.ProgressMark != 1 || row.Generation != lease.Generation {
			t.Fatalf("row = %+v, want COMPLETED at cursor 5, mark 1, generation %d", row, lease.Generation)
		}
		if n := db.Count(t, `SELECT count(*) FROM videos WHERE id = 'V2' AND pending = 0`); n != 1 {
			t.Fatal("the on_completed cascade did not count video V2's child down")
		}
	})

	t.Run("OperatorRoleCancelsRequeuesInspectsAndPrunes", func(t *testing.T) {
		rdb := realRedis(t)
		q, id := unique("opsroles"), unique("Jops")
		t.Cleanup(func() {
			ctx := context.WithoutCancel(t.Context())
			_ = queuetest.Remove(ctx, rdb, q)
			rdb.Del(ctx, queue.MarkerKey(id))
		})
		ops := func(args ...string) []string {
			return append(args, "--config", file, "--database-url", roleURL(t, db, operatorRole), "--schema", db.Schema, "--redis-url", redisTestURL())
		}
		db.Insert(t, jobstest.Job{ID: id, Type: "report.export", Status: jobs.StatusQueued, Queue: q, ParentID: "V3"})
		if _, err := asynq.NewClientFromRedisClient(rdb).Enqueue(asynq.NewTask("report.export", []byte("p")), asynq.TaskID(id), asynq.Queue(q)); err != nil {
			t.Fatal(err)
		}

		requireExit(t, run(t, ops("cancel", "--reason", "operator role", id)...), exitOK)
		if row := db.Read(t, id); row.Status != jobs.StatusFailed || row.FailureReason != jobs.ReasonCancelled {
			t.Fatalf("row after cancel = %+v", row)
		}
		if n := db.Count(t, `SELECT count(*) FROM `+s+`.jobs WHERE id = $1 AND marker_set_at IS NOT NULL`, id); n != 1 {
			t.Fatal("the operator role did not record the cancel's marker")
		}
		if n := db.Count(t, `SELECT count(*) FROM videos WHERE id = 'V3' AND status = 'FAILED' AND failed_child = $1`, id); n != 1 {
			t.Fatal("cancel's on_failed cascade did not fail video V3")
		}

		if err := asynq.NewInspectorFromRedisClient(rdb).ArchiveTask(q, id); err != nil {
			t.Fatal(err)
		}
		requireExit(t, run(t, ops("requeue", "--reason", "operator role", id)...), exitOK)
		if row := db.Read(t, id); row.Status != jobs.StatusQueued || row.Generation != 1 {
			t.Fatalf("row after requeue = %+v", row)
		}
		if n := db.Count(t, `SELECT count(*) FROM videos WHERE id = 'V3' AND status = 'WAITING_CHILDREN' AND failed_child IS NULL`); n != 1 {
			t.Fatal("requeue's on_requeued cascade did not reset video V3")
		}
		requireExit(t, run(t, ops("inspect", id)...), exitOK)

		old := unique("Jold")
		db.Insert(t, jobstest.Job{ID: old, Type: "report.export", Status: jobs.StatusCompleted})
		db.Exec(t, `INSERT INTO `+s+`.job_events (job_id, kind, generation) VALUES ($1, 'claimed', 1)`, old)
		db.Exec(t, `UPDATE `+s+`.jobs SET finished_at = now() - interval '30 days' WHERE id = $1`, old)
		pruneArgs := []string{"prune", "--older-than", "8d", "--database-url", roleURL(t, db, operatorRole), "--schema", db.Schema}
		requireExit(t, run(t, pruneArgs...), exitOK)
		if n := db.Count(t, `SELECT count(*) FROM `+s+`.job_events WHERE job_id = $1`, old); n != 0 {
			t.Fatalf("%d events of the old job left after prune", n)
		}
		if n := db.Count(t, `SELECT count(*) FROM `+s+`.prune_runs WHERE events >= 1 AND complete`); n != 1 {
			t.Fatal("prune as the operator role did not record its run")
		}

		operator, err := pgx.Connect(ctx, roleURL(t, db, operatorRole))
		if err != nil {
			t.Fatal(err)
		}
		defer operator.Close(context.WithoutCancel(ctx))
		for _, sql := range []string{
			`UPDATE ` + s + `.videos SET title = 'overwritten'`,
			`UPDATE ` + s + `.jobs SET type = 'other'`,
			`UPDATE ` + s + `.jobs SET "cursor" = 0`,
			`UPDATE ` + s + `.jobs SET worker = 'someone'`,
			`DELETE FROM ` + s + `.jobs`,
			`INSERT INTO ` + s + `.jobs (id, type) VALUES ('x', 'report.export')`,
			`INSERT INTO ` + s + `.job_types (name, max_runtime) VALUES ('x', '1 minute')`,
			`DELETE FROM ` + s + `.leader_leases`,
			`CREATE TABLE ` + s + `.intruder (id int)`,
		} {
			requireDenied(t, operator, sql)
		}
	})

	t.Run("ReaperRoleSuggestsLimitsAndRecordsItsPass", func(t *testing.T) {
		r := run(t, "suggest-limits", "--output", "json", "--database-url", roleURL(t, db, reaperRole), "--schema", db.Schema)
		requireExit(t, r, exitOK)
		if !strings.Contains(r.stdout, `"type":"report.export"`) {
			t.Fatalf("suggest-limits as the reaper role: %s, want the type report.export", r.stdout)
		}
		pool, err := jobs.Connect(ctx, roleURL(t, db, reaperRole), db.Schema)
		if err != nil {
			t.Fatal(err)
		}
		defer pool.Close()
		store := pgstore.New(pool, pgstore.WithSchema(db.Schema))
		rec := pgstore.PassRecord{Key: "[\"roles\"]", HolderID: "h1", HolderHost: "host", Summary: []byte(`{"reaped":1}`)}
		for range 2 { // the second one replaces the first
			if err := store.RecordPass(ctx, rec); err != nil {
				t.Fatalf("recording a pass as the reaper role: %v", err)
			}
		}
		recs, err := store.PassRecords(ctx)
		if err != nil || len(recs) != 1 || recs[0].HolderID != "h1" {
			t.Fatalf("pass records read as the reaper role: %+v, %v", recs, err)
		}
		if _, err := store.RecentReaps(ctx, 100); err != nil {
			t.Fatalf("reading the reaps as the reaper role: %v", err)
		}
		if _, err := store.LeaderLeaseDetails(ctx); err != nil {
			t.Fatalf("reading the leader leases as the reaper role: %v", err)
		}
	})

	t.Run("NeitherRoleWritesWhatItDoesNotOwn", func(t *testing.T) {
		reaper, err := pgx.Connect(ctx, roleURL(t, db, reaperRole))
		if err != nil {
			t.Fatal(err)
		}
		defer reaper.Close(context.WithoutCancel(ctx))
		for _, sql := range []string{
			`UPDATE ` + s + `.videos SET title = 'overwritten'`,
			`UPDATE ` + s + `.videos SET pending = 9 WHERE false`, // granted for the cascade: allowed
			`UPDATE ` + s + `.jobs SET type = 'other'`,
			`UPDATE ` + s + `.jobs SET "cursor" = 0`,
			`UPDATE ` + s + `.jobs SET progress_mark = 0`,
			`UPDATE ` + s + `.jobs SET updated_at = now()`,
			`DELETE FROM ` + s + `.jobs`,
			`INSERT INTO ` + s + `.jobs (id, type) VALUES ('x', 'report.export')`,
			`INSERT INTO ` + s + `.job_types (name, max_runtime) VALUES ('x', '1 minute')`,
			`CREATE TABLE ` + s + `.intruder (id int)`,
			// Ending a hold early is an operator's act.
			`UPDATE ` + s + `.reaper_holds SET released_at = now()`,
			`DELETE FROM ` + s + `.reaper_holds`,
			`DELETE FROM ` + s + `.reaper_passes`,
			`DELETE FROM ` + s + `.job_events`,
		} {
			if strings.Contains(sql, "WHERE false") {
				if _, err := reaper.Exec(ctx, sql); err != nil {
					t.Fatalf("%s as the reaper role: %v, want it allowed (the cascade's grant)", sql, err)
				}
				continue
			}
			requireDenied(t, reaper, sql)
		}
		if n := db.Count(t, `SELECT count(*) FROM videos WHERE title IN ('first', 'second')`); n != 2 {
			t.Fatal("a product title changed")
		}

		worker, err := pgx.Connect(ctx, roleURL(t, db, workerRole))
		if err != nil {
			t.Fatal(err)
		}
		defer worker.Close(context.WithoutCancel(ctx))
		for _, sql := range []string{
			`UPDATE ` + s + `.videos SET title = 'overwritten'`,
			`SELECT count(*) FROM ` + s + `.reaper_holds`,
			`UPDATE ` + s + `.jobs SET marker_set_at = now()`,
			`UPDATE ` + s + `.jobs SET type = 'other'`,
			`DELETE FROM ` + s + `.jobs`,
			`DELETE FROM ` + s + `.job_events`,
			`INSERT INTO ` + s + `.job_types (name, max_runtime) VALUES ('x', '1 minute')`,
		} {
			requireDenied(t, worker, sql)
		}

		operator, err := pgx.Connect(ctx, roleURL(t, db, operatorRole))
		if err != nil {
			t.Fatal(err)
		}
		defer operator.Close(context.WithoutCancel(ctx))
		for _, sql := range []string{
			`UPDATE ` + s + `.reaper_holds SET until = now() + interval '1 year'`,
			`UPDATE ` + s + `.reaper_holds SET drained_at = NULL`,
			`INSERT INTO ` + s + `.reaper_holds (queues, types, held, judged, tripped, until) VALUES ('{q}', '{}', 1, 1, 'x', now())`,
			`DELETE FROM ` + s + `.reaper_holds`,
		} {
			requireDenied(t, operator, sql)
		}
	})
}
