package jobstest

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/jobreaper/jobreaper/jobs"
)

// The product side of the seed's flows, shared by the tests of every
// package that runs them (the jobs tests, the race suite). Each flow's
// tables are created by the test (never by migrations), and each worker
// function is written the way the library asks handlers to be: external
// calls first (with Lease.IdempotencyKey), then one transaction whose first
// write is the completion.

// CourseSchema holds the course flow's tables: a job adds a chapter (with a
// lesson and a lecture) to a course; the course is the job's parent_id.
const CourseSchema = `
CREATE TABLE courses  (id text PRIMARY KEY, chapter_count int NOT NULL DEFAULT 0);
CREATE TABLE chapters (id bigserial PRIMARY KEY, course_id text NOT NULL, job_id text NOT NULL, title text NOT NULL);
CREATE TABLE lessons  (id bigserial PRIMARY KEY, chapter_id bigint NOT NULL REFERENCES chapters, title text NOT NULL);
CREATE TABLE lectures (id bigserial PRIMARY KEY, lesson_id bigint NOT NULL REFERENCES lessons, body text NOT NULL);`

// AddChapters is the course handler's ending: the generated outline (an
// external call already made) is written after Complete in one transaction.
func AddChapters(ctx context.Context, store *jobs.Store, db *DB, lease jobs.Lease) (jobs.CompleteResult, error) {
	return store.CompleteWith(ctx, db.Pool, lease, func(tx pgx.Tx) error {
		var chapter, lesson int64
		if err := tx.QueryRow(ctx, `INSERT INTO chapters (course_id, job_id, title) VALUES ($1, $2, 'Chapter') RETURNING id`,
			lease.ParentID, lease.JobID).Scan(&chapter); err != nil {
			return err
		}
		if err := tx.QueryRow(ctx, `INSERT INTO lessons (chapter_id, title) VALUES ($1, 'Lesson') RETURNING id`, chapter).Scan(&lesson); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO lectures (lesson_id, body) VALUES ($1, 'Lecture')`, lesson); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `UPDATE courses SET chapter_count = chapter_count + 1 WHERE id = $1`, lease.ParentID)
		return err
	})
}

// VideoSchema holds the video composition flow's tables: the job renders a
// video (parent_id). Completion marks it READY; metadata follows in separate
// writes; usage is charged only when all metadata was written, re-checking
// the completion.
const VideoSchema = `
CREATE TABLE videos (id text PRIMARY KEY, status text NOT NULL DEFAULT 'RENDERING',
                     title text, duration_s int CHECK (duration_s > 0), thumbnail text);
CREATE TABLE usage  (id bigserial PRIMARY KEY, job_id text NOT NULL, tenant_id text, units int NOT NULL);`

// ComposeVideo is the video handler's ending. badMetadata makes the second
// metadata update fail (a duration the table refuses). It reports whether
// usage was charged.
func ComposeVideo(ctx context.Context, store *jobs.Store, db *DB, lease jobs.Lease, badMetadata bool) (bool, error) {
	res, err := store.CompleteWith(ctx, db.Pool, lease, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `UPDATE videos SET status = 'READY' WHERE id = $1`, lease.ParentID)
		return err
	})
	if err != nil {
		return false, err
	}
	if res.Replayed {
		// A retry after a lost acknowledgement: whether the first run got
		// to metadata and charge is unknown; a real handler would look the
		// charge up by lease.IdempotencyKey("charge"). Not needed here.
		return false, nil
	}
	duration := 42
	if badMetadata {
		duration = -1
	}
	for _, m := range []struct {
		sql string
		arg any
	}{
		{`UPDATE videos SET title = $2 WHERE id = $1`, "A video"},
		{`UPDATE videos SET duration_s = $2 WHERE id = $1`, duration},
		{`UPDATE videos SET thumbnail = $2 WHERE id = $1`, "thumb.png"},
	} {
		if _, err := db.Pool.Exec(ctx, m.sql, lease.ParentID, m.arg); err != nil {
			return false, fmt.Errorf("metadata of video %s: %w", lease.ParentID, err)
		}
	}
	err = store.AfterCompleted(ctx, db.Pool, lease, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO usage (job_id, tenant_id, units) VALUES ($1, nullif($2, ''), 1)`, lease.JobID, lease.TenantID)
		return err
	})
	return err == nil, err
}

// ExportSchema holds the export flow's tables: the job exports a READY
// source into an export row (parent_id is the export). A reaped export is
// marked FAILED by the on_failed cascade (ExportCascades); the source is
// never touched by a failure.
const ExportSchema = `
CREATE TABLE sources (id text PRIMARY KEY, status text NOT NULL DEFAULT 'READY', exported_at timestamptz);
CREATE TABLE exports (id text PRIMARY KEY, source_id text NOT NULL REFERENCES sources, status text NOT NULL DEFAULT 'RUNNING', url text);`

// ExportCascades fails the export row of a failed or reaped report.export
// job.
var ExportCascades = jobs.Cascades{"report.export": {
	OnFailed: []string{`UPDATE exports SET status = 'FAILED' WHERE id = @parent_id`},
}}

// Export is the export handler's ending: the file was uploaded before (named
// after the fencing token, so a refused attempt's file can be found).
func Export(ctx context.Context, store *jobs.Store, db *DB, lease jobs.Lease) error {
	_, err := store.CompleteWith(ctx, db.Pool, lease, func(tx pgx.Tx) error {
		var source string
		if err := tx.QueryRow(ctx, `UPDATE exports SET status = 'DONE', url = $2 WHERE id = $1 RETURNING source_id`,
			lease.ParentID, "s3://exports/"+lease.FencingToken()+".csv").Scan(&source); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `UPDATE sources SET exported_at = now() WHERE id = $1`, source)
		return err
	})
	return err
}

// ParentSchema holds the tables of a parent with pending children: the
// parent is a product row referenced by the children's jobs.parent_id.
// Children are charged on completion; the cascades (ParentCascades) keep
// the aggregate. The statements are written without guards against double
// counting on purpose: only the fencing keeps them right.
const ParentSchema = `
CREATE TABLE parents (id text PRIMARY KEY, status text NOT NULL DEFAULT 'WAITING_CHILDREN',
                      pending int NOT NULL, completed int NOT NULL DEFAULT 0, failed int NOT NULL DEFAULT 0);
CREATE TABLE parent_events (id bigserial PRIMARY KEY, parent_id text NOT NULL, kind text NOT NULL);
CREATE TABLE notifications (id bigserial PRIMARY KEY, job_id text NOT NULL, kind text NOT NULL);
CREATE TABLE usage (id bigserial PRIMARY KEY, job_id text NOT NULL, tenant_id text, units int NOT NULL);`

const childCompleted = `
WITH p AS (
    UPDATE parents
       SET pending = pending - 1, completed = completed + 1,
           status = CASE WHEN status <> 'WAITING_CHILDREN' THEN status
                         WHEN pending = 1 AND failed = 0 THEN 'READY'
                         WHEN pending = 1 THEN 'PARTIAL'
                         ELSE status END
     WHERE id = @parent_id
 RETURNING id, status, pending)
INSERT INTO parent_events (parent_id, kind)
SELECT id, lower(status) FROM p WHERE pending = 0 AND status IN ('READY', 'PARTIAL')`

// ParentCascades returns the cascades of type typ under a policy: failParent
// fails the parent at the first failed child; otherwise the parent tolerates
// failures, waits for the other children and ends PARTIAL.
func ParentCascades(typ string, failParent bool) jobs.Cascades {
	onFailed := `
WITH p AS (
    UPDATE parents
       SET pending = pending - 1, failed = failed + 1,
           status = CASE WHEN status = 'WAITING_CHILDREN' THEN 'FAILED' ELSE status END
     WHERE id = @parent_id
 RETURNING id, status, failed)
INSERT INTO parent_events (parent_id, kind) SELECT id, 'failed' FROM p WHERE failed = 1`
	if !failParent {
		onFailed = `
WITH p AS (
    UPDATE parents
       SET pending = pending - 1, failed = failed + 1,
           status = CASE WHEN status = 'WAITING_CHILDREN' AND pending = 1 THEN 'PARTIAL' ELSE status END
     WHERE id = @parent_id
 RETURNING id, status, pending)
INSERT INTO parent_events (parent_id, kind) SELECT id, 'partial' FROM p WHERE pending = 0 AND status = 'PARTIAL'`
	}
	return jobs.Cascades{typ: {
		OnFailed:    []string{onFailed, `INSERT INTO notifications (job_id, kind) VALUES (@job_id, 'child_failed')`},
		OnCompleted: []string{childCompleted},
	}}
}

// CompleteChild is a child handler's ending: completion (with its cascade)
// and the child's usage charge in one transaction.
func CompleteChild(ctx context.Context, store *jobs.Store, db *DB, lease jobs.Lease) (jobs.CompleteResult, error) {
	return store.CompleteWith(ctx, db.Pool, lease, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO usage (job_id, tenant_id, units) VALUES ($1, nullif($2, ''), 1)`, lease.JobID, lease.TenantID)
		return err
	})
}

// ParentState is a parents row (ReadParent).
type ParentState struct {
	Status                     string
	Pending, Completed, Failed int
}

// ReadParent reads parents row id.
func ReadParent(ctx context.Context, db *DB, id string) (ParentState, error) {
	var p ParentState
	err := db.Pool.QueryRow(ctx, `SELECT status, pending, completed, failed FROM parents WHERE id = $1`, id).
		Scan(&p.Status, &p.Pending, &p.Completed, &p.Failed)
	return p, err
}

// ItemsTable is the product table of the batch flow: one row per item a
// batch produced, with the generation of the attempt that wrote it.
const ItemsTable = `CREATE TABLE items (job_id text NOT NULL, n bigint NOT NULL, generation bigint NOT NULL)`

// Batch runs one batch of the batch flow the way a handler does: Advance
// first in the transaction, then the batch's item rows (items from+1 to
// from+count, ItemsTable) unless the batch was replayed.
func Batch(ctx context.Context, store *jobs.Store, db *DB, lease jobs.Lease, token string, from, count int64) (jobs.AdvanceResult, error) {
	var res jobs.AdvanceResult
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		return res, err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	res, err = store.Advance(ctx, tx, lease, token, from, count)
	if err != nil || res.Replayed {
		return res, err
	}
	if _, err := tx.Exec(ctx, `INSERT INTO items (job_id, n, generation)
SELECT $1, n, $2 FROM generate_series($3::bigint, $4::bigint) n`, lease.JobID, lease.Generation, from+1, from+count); err != nil {
		return res, err
	}
	return res, tx.Commit(ctx)
}
