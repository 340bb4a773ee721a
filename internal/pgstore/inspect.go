package pgstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/jobreaper/jobreaper/internal/idcheck"
	"github.com/jobreaper/jobreaper/internal/pgcore"
)

// Record is one job's whole story as PostgreSQL holds it: the row, its
// type's limits, its runtime and idle time on the database clock, its
// recorded batches and its events. `jobreaper inspect` prints it.
type Record struct {
	pgcore.Snapshot
	// TenantID is "" when NULL.
	TenantID string
	// Cursor and Total are the resumable progress (Total nil when NULL).
	Cursor int64
	Total  *int64
	// CreatedAt is the row's creation; FinishedAt nil while not terminal.
	CreatedAt  time.Time
	FinishedAt *time.Time
	// MarkerSetAt is when the reaper confirmed the marker of a reap or
	// cancel; nil when none was confirmed.
	MarkerSetAt *time.Time
	// Infinite names the row's timestamps that hold 'infinity' or
	// '-infinity' (which the product's own SQL can write): column name
	// (created_at, started_at, updated_at, finished_at, marker_set_at) to
	// "infinity" or "-infinity". Such a column's time field above is zero
	// (or nil), and so is every duration computed from it.
	Infinite map[string]string
	// DBNow is the database's now() of the read. Runtime is the last
	// attempt's (nil without a finite start time): from started_at to
	// finished_at for a COMPLETED or FAILED row, to DBNow otherwise. Idle
	// is the time since updated_at, frozen at finished_at for a COMPLETED
	// or FAILED row as Runtime is (nil when updated_at is infinite).
	DBNow   time.Time
	Runtime *time.Duration
	Idle    *time.Duration
	// BatchCount is how many batch records the job has; Batches are the
	// last few of them, newest first.
	BatchCount int64
	Batches    []BatchRecord
	// EventCount is how many events the job has; Events are the last
	// ones, oldest first.
	EventCount int64
	Events     []EventRecord
}

// BatchRecord is one job_batches row.
type BatchRecord struct {
	Token          string    `json:"token"`
	Generation     int64     `json:"generation"`
	ExpectedCursor int64     `json:"expected_cursor"`
	Count          int64     `json:"count"`
	CursorAfter    int64     `json:"cursor_after"`
	At             time.Time `json:"at"`
}

// EventRecord is one job_events row.
type EventRecord struct {
	Kind string    `json:"kind"`
	At   time.Time `json:"at"`
	// Generation is nil when the event names none.
	Generation *int64          `json:"generation"`
	Worker     string          `json:"worker,omitempty"`
	Detail     json.RawMessage `json:"detail"`
}

const inspectRowSQL = `SELECT ` + pgcore.SnapshotColumns + `
  FROM {schema}.jobs j LEFT JOIN {schema}.job_types t ON t.name = j.type
 WHERE j.id = $1`

const inspectExtraSQL = `
SELECT coalesce(tenant_id, ''), "cursor", total,
       CASE WHEN isfinite(created_at) THEN created_at END,
       CASE WHEN isfinite(finished_at) THEN finished_at END,
       CASE WHEN isfinite(marker_set_at) THEN marker_set_at END,
       now(),
       CASE WHEN NOT isfinite(started_at) THEN NULL
            WHEN status IN ('COMPLETED', 'FAILED') AND isfinite(finished_at) AND finished_at >= started_at
            THEN finished_at - started_at ELSE now() - started_at END,
       CASE WHEN NOT isfinite(updated_at) THEN NULL
            WHEN status IN ('COMPLETED', 'FAILED') AND isfinite(finished_at) AND finished_at >= updated_at
            THEN finished_at - updated_at ELSE now() - updated_at END,
       array_remove(ARRAY[
           CASE WHEN NOT isfinite(created_at) THEN 'created_at=' || created_at::text END,
           CASE WHEN NOT isfinite(started_at) THEN 'started_at=' || started_at::text END,
           CASE WHEN NOT isfinite(updated_at) THEN 'updated_at=' || updated_at::text END,
           CASE WHEN NOT isfinite(finished_at) THEN 'finished_at=' || finished_at::text END,
           CASE WHEN NOT isfinite(marker_set_at) THEN 'marker_set_at=' || marker_set_at::text END], NULL)
  FROM {schema}.jobs WHERE id = $1`

const inspectBatchesSQL = `
SELECT token, generation, expected_cursor, count, cursor_after, at, count(*) OVER ()
  FROM {schema}.job_batches WHERE job_id = $1
 ORDER BY at DESC, cursor_after DESC
 LIMIT $2`

const inspectEventsSQL = `
SELECT kind, at, generation, coalesce(worker, ''), detail::text, total FROM (
    SELECT e.*, count(*) OVER () AS total FROM {schema}.job_events e WHERE e.job_id = $1
     ORDER BY e.id DESC LIMIT $2) last
 ORDER BY id`

// Inspect reads job id's Record, with at most batches batch records and
// events events (the most recent ones), in one transaction (one
// connection, so behind a pooler too the reads meet the same server).
//
// Errors: pgcore.ErrInvalidArgument for an ID PostgreSQL cannot store (CheckID);
// pgcore.ErrNotFound when no row has the ID; a wrapped driver error or the
// operation's timeout otherwise.
func (s *Store) Inspect(ctx context.Context, id string, batches, events int) (Record, error) {
	ctx, done := s.core.Op(ctx, "Inspect")
	if err := idcheck.CheckID(id); err != nil {
		return Record{}, done(err)
	}
	var rec Record
	err := s.core.InTx(ctx, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, s.core.Q(inspectRowSQL), id)
		if err != nil {
			return err
		}
		rec.Snapshot, err = pgx.CollectExactlyOneRow(rows, pgcore.ScanSnapshot)
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("job %s: %w", id, pgcore.ErrNotFound)
		}
		if err != nil {
			return err
		}
		var (
			runtime, idle pgtype.Interval
			created       *time.Time
			infinite      []string
		)
		if err := tx.QueryRow(ctx, s.core.Q(inspectExtraSQL), id).Scan(&rec.TenantID, &rec.Cursor, &rec.Total,
			&created, &rec.FinishedAt, &rec.MarkerSetAt, &rec.DBNow, &runtime, &idle, &infinite); err != nil {
			return err
		}
		if created != nil {
			rec.CreatedAt = *created
		}
		for _, kv := range infinite {
			column, value, _ := strings.Cut(kv, "=")
			if rec.Infinite == nil {
				rec.Infinite = make(map[string]string, len(infinite))
			}
			rec.Infinite[column] = value
		}
		rec.Runtime = pgcore.OptionalDuration(runtime)
		rec.Idle = pgcore.OptionalDuration(idle)
		rows, err = tx.Query(ctx, s.core.Q(inspectBatchesSQL), id, batches)
		if err != nil {
			return err
		}
		rec.Batches, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (BatchRecord, error) {
			var b BatchRecord
			return b, row.Scan(&b.Token, &b.Generation, &b.ExpectedCursor, &b.Count, &b.CursorAfter, &b.At, &rec.BatchCount)
		})
		if err != nil {
			return err
		}
		if rec.BatchCount == 0 {
			err = tx.QueryRow(ctx, s.core.Q(`SELECT count(*) FROM {schema}.job_batches WHERE job_id = $1`), id).Scan(&rec.BatchCount)
			if err != nil {
				return err
			}
		}
		rows, err = tx.Query(ctx, s.core.Q(inspectEventsSQL), id, events)
		if err != nil {
			return err
		}
		rec.Events, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (EventRecord, error) {
			var (
				e      EventRecord
				detail string
			)
			err := row.Scan(&e.Kind, &e.At, &e.Generation, &e.Worker, &detail, &rec.EventCount)
			e.Detail = json.RawMessage(detail)
			return e, err
		})
		if err != nil {
			return err
		}
		if rec.EventCount == 0 {
			return tx.QueryRow(ctx, s.core.Q(`SELECT count(*) FROM {schema}.job_events WHERE job_id = $1`), id).Scan(&rec.EventCount)
		}
		return nil
	})
	return rec, done(err)
}
