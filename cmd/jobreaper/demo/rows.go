package demo

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/jobreaper/jobreaper/jobs"
)

// The story's reads of the demo schema, for the claims' checks.

// jobRow is a job as the claims check it, with durations on the database
// clock.
type jobRow struct {
	status, failureReason string
	generation            int64
	cursor, total         int64
	progressMark          int64
	// runtime is now (or finished_at) - started_at; idle is now -
	// updated_at; both 0 before the first claim.
	runtime, idle time.Duration
	startedAt     time.Time
}

const readJobsSQL = `
SELECT id, status, coalesce(failure_reason, ''), generation, "cursor", coalesce(total, 0), progress_mark,
       coalesce(started_at, now()),
       coalesce(extract(epoch FROM coalesce(finished_at, now()) - started_at), 0)::float8,
       extract(epoch FROM now() - updated_at)::float8
  FROM {schema}.jobs WHERE id = ANY($1)`

// readJobs reads the story's four jobs.
func (w *world) readJobs(ctx context.Context) (map[string]jobRow, error) {
	ctx, cancel := context.WithTimeout(ctx, jobs.OpTimeoutDefault)
	defer cancel()
	rows, err := w.pool.Query(ctx, w.sql(readJobsSQL), w.ids.all())
	if err != nil {
		return nil, fmt.Errorf("reading the story's jobs: %w", err)
	}
	defer rows.Close()
	out := map[string]jobRow{}
	for rows.Next() {
		var (
			id            string
			r             jobRow
			runtime, idle float64
		)
		if err := rows.Scan(&id, &r.status, &r.failureReason, &r.generation, &r.cursor, &r.total,
			&r.progressMark, &r.startedAt, &runtime, &idle); err != nil {
			return nil, fmt.Errorf("reading the story's jobs: %w", err)
		}
		r.runtime, r.idle = seconds(runtime), seconds(idle)
		out[id] = r
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("reading the story's jobs: %w", err)
	}
	return out, nil
}

func (w *world) readJob(ctx context.Context, id string) (jobRow, error) {
	rows, err := w.readJobs(ctx)
	if err != nil {
		return jobRow{}, err
	}
	r, ok := rows[id]
	if !ok {
		return jobRow{}, fmt.Errorf("job %s has no row", id)
	}
	return r, nil
}

// count runs a count(*) query.
func (w *world) count(ctx context.Context, sql string, args ...any) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, jobs.OpTimeoutDefault)
	defer cancel()
	var n int
	if err := w.pool.QueryRow(ctx, w.sql(sql), args...).Scan(&n); err != nil {
		return 0, fmt.Errorf("counting (%s): %w", strings.Fields(sql)[0], err)
	}
	return n, nil
}

// event reads the detail of job id's last event of kind, optionally only
// those whose detail contains match (JSON); found is false when none.
func (w *world) event(ctx context.Context, id, kind, match string) (detail []byte, found bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, jobs.OpTimeoutDefault)
	defer cancel()
	err = w.pool.QueryRow(ctx, w.sql(`SELECT detail::text FROM {schema}.job_events
 WHERE job_id = $1 AND kind = $2 AND detail @> $3::jsonb ORDER BY id DESC LIMIT 1`), id, kind, match).Scan(&detail)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("reading the %s event of %s: %w", kind, id, err)
	}
	return detail, true, nil
}

// evidence is the detail of a reaped event (see pgstore.Evidence).
type evidence struct {
	Reason              string    `json:"reason"`
	Generation          int64     `json:"generation"`
	Worker              string    `json:"worker"`
	StartedAt           time.Time `json:"started_at"`
	UpdatedAt           time.Time `json:"updated_at"`
	DBNow               time.Time `json:"db_now"`
	RuntimeSeconds      float64   `json:"runtime_seconds"`
	IdleSeconds         float64   `json:"idle_seconds"`
	MaxRuntimeSeconds   float64   `json:"max_runtime_seconds"`
	StallTimeoutSeconds float64   `json:"stall_timeout_seconds"`
}

func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// sql names the demo's schema where text writes {schema}.
func (w *world) sql(text string) string { return qualify(text, w.schema) }

// qualify replaces {schema} in text with schema's quoted identifier.
func qualify(text, schema string) string {
	return strings.ReplaceAll(text, "{schema}", pgx.Identifier{schema}.Sanitize())
}
