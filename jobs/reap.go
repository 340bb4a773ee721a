package jobs

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
)

// Failure reasons: fixed codes stored in jobs.failure_reason, never error
// text.
const (
	// ReasonStalled: reaped because runtime exceeded the type's max_runtime
	// and the job made no progress for the stall timeout.
	ReasonStalled = "stalled"
	// ReasonLostTask: reaped because asynq will never run the job's task
	// again (archived, completed or gone) while the row said PROCESSING.
	ReasonLostTask = "lost_task"
)

// HardTimeoutDefault is the hard_timeout of a job type whose column is NULL:
// the asynq Timeout the enqueue helper passes, a ceiling beyond which asynq
// cancels and retries a task whatever its progress.
const HardTimeoutDefault = 24 * time.Hour

// StallRule holds the daemon-wide values the stall predicate needs besides
// the job_types row.
type StallRule struct {
	// DefaultStallTimeout applies to types whose stall_timeout is NULL.
	DefaultStallTimeout time.Duration
	// MinStallTimeout is 2 x heartbeat interval + scan interval: a type whose
	// stall timeout is below it would reap live workers between two of
	// their heartbeats, so its jobs are skipped as bad_limits.
	MinStallTimeout time.Duration
	// DefaultHardTimeout applies to types whose hard_timeout is NULL
	// (normally HardTimeoutDefault).
	DefaultHardTimeout time.Duration
}

func (r StallRule) args() pgx.NamedArgs {
	return pgx.NamedArgs{
		"default_stall": Interval(r.DefaultStallTimeout),
		"min_stall":     Interval(r.MinStallTimeout),
		"default_hard":  Interval(r.DefaultHardTimeout),
	}
}

// StallPredicate is the whole stall rule as SQL over jobs j joined with
// job_types t, on the database clock: the job is PROCESSING with a start
// time, its type's limits are sane (stall timeout at least @min_stall;
// hard_timeout longer than max_runtime + stall timeout), its runtime exceeds
// max_runtime and its idle time reaches the stall timeout. Every SQL form of
// the rule (the reap UPDATE, set-based scans) uses this one fragment, and
// reaper.Decide states the same rule in Go; one boundary table tests both.
const StallPredicate = `
      j.status = 'PROCESSING'
  AND j.started_at IS NOT NULL
  AND coalesce(t.stall_timeout, @default_stall) >= @min_stall
  AND coalesce(t.hard_timeout, @default_hard) > t.max_runtime + coalesce(t.stall_timeout, @default_stall)
  AND now() - j.started_at > t.max_runtime
  AND now() - j.updated_at >= coalesce(t.stall_timeout, @default_stall)`

// reapSQL is the reap's compare-and-set. marker_set_at is cleared: this
// reap's marker is not written yet.
const reapSQL = `
UPDATE {schema}.jobs j
   SET status = 'FAILED', failure_reason = @reason, finished_at = now(), marker_set_at = NULL
  FROM {schema}.job_types t
 WHERE j.id = @job_id
   AND t.name = j.type
   AND j.generation = @generation
   AND j.updated_at = @updated_at
   AND ` + StallPredicate + `
RETURNING j.generation, coalesce(j.worker, ''), j.type, coalesce(j.parent_id, ''), coalesce(j.tenant_id, ''),
          j.started_at, j.updated_at,
          (extract(epoch FROM now() - j.started_at) * 1000000)::bigint,
          (extract(epoch FROM now() - j.updated_at) * 1000000)::bigint,
          (extract(epoch FROM t.max_runtime) * 1000000)::bigint,
          (extract(epoch FROM coalesce(t.stall_timeout, @default_stall)) * 1000000)::bigint,
          now()`

// ReapParams names the job to reap and the state it was read in.
type ReapParams struct {
	JobID string
	// Generation and UpdatedAt are the values read; the reap changes nothing
	// if either moved since.
	Generation int64
	UpdatedAt  time.Time
	// Reason is ReasonStalled or ReasonLostTask.
	Reason string
	Rule   StallRule
}

// Evidence records why a job was reaped, on the database clock. It is
// stored in the reaped event's detail.
type Evidence struct {
	Reason       string        `json:"reason"`
	Generation   int64         `json:"generation"`
	Worker       string        `json:"worker"`
	StartedAt    time.Time     `json:"started_at"`
	UpdatedAt    time.Time     `json:"updated_at"`
	Runtime      time.Duration `json:"-"`
	Idle         time.Duration `json:"-"`
	MaxRuntime   time.Duration `json:"-"`
	StallTimeout time.Duration `json:"-"`
	// DBNow is the database's now() of the reap; the marker's 7 days run
	// from it.
	DBNow time.Time `json:"db_now"`
}

func (e Evidence) detail() ([]byte, error) {
	type seconds struct {
		Evidence
		RuntimeSeconds      float64 `json:"runtime_seconds"`
		IdleSeconds         float64 `json:"idle_seconds"`
		MaxRuntimeSeconds   float64 `json:"max_runtime_seconds"`
		StallTimeoutSeconds float64 `json:"stall_timeout_seconds"`
	}
	return json.Marshal(seconds{e, e.Runtime.Seconds(), e.Idle.Seconds(), e.MaxRuntime.Seconds(), e.StallTimeout.Seconds()})
}

// Reap fails a stalled job with a compare-and-set: one UPDATE whose WHERE
// repeats the read generation and updated_at, status PROCESSING, and the
// whole StallPredicate against the current job_types row and now(). A job
// that progressed, was reclaimed, finished, or whose limits were raised
// since the read changes 0 rows, and then nothing else is written. On 1 row
// the same transaction appends a "reaped" event carrying the Evidence and
// runs the type's on_failed cascade.
//
// It returns reaped=false with a zero Evidence when the CAS matched nothing,
// and an error (nothing written) when PostgreSQL or a cascade failed; an
// error wrapping ErrTxEnded (never reaped=true) when a cascade statement
// ended the transaction, so the UPDATE, the event and the cascade did not
// commit together.
func (s *Store) Reap(ctx context.Context, p ReapParams) (reaped bool, ev Evidence, err error) {
	ctx, done := s.op(ctx, "Reap")
	args := p.Rule.args()
	args["job_id"], args["generation"], args["updated_at"], args["reason"] = p.JobID, p.Generation, p.UpdatedAt, p.Reason
	err = s.inTx(ctx, func(tx pgx.Tx) error {
		var (
			cascade                      cascadeArgs
			runUS, idleUS, maxUS, stalUS int64
		)
		err := tx.QueryRow(ctx, s.q(reapSQL), args).Scan(&ev.Generation, &ev.Worker, &cascade.Type,
			&cascade.ParentID, &cascade.TenantID, &ev.StartedAt, &ev.UpdatedAt,
			&runUS, &idleUS, &maxUS, &stalUS, &ev.DBNow)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		if err != nil {
			return err
		}
		reaped = true
		ev.Reason = p.Reason
		ev.Runtime, ev.Idle = time.Duration(runUS)*time.Microsecond, time.Duration(idleUS)*time.Microsecond
		ev.MaxRuntime, ev.StallTimeout = time.Duration(maxUS)*time.Microsecond, time.Duration(stalUS)*time.Microsecond
		detail, err := ev.detail()
		if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, s.q(`INSERT INTO {schema}.job_events (job_id, kind, generation, worker, detail)
VALUES ($1, 'reaped', $2, nullif($3, ''), $4)`), p.JobID, ev.Generation, ev.Worker, jsonText(detail)); err != nil {
			return err
		}
		cascade.JobID = p.JobID
		return s.cascades.runFailed(ctx, tx, cascade)
	})
	if err != nil {
		return false, Evidence{}, done(err)
	}
	if !reaped {
		ev = Evidence{}
	}
	return reaped, ev, done(nil)
}
