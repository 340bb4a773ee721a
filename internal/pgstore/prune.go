package pgstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jobreaper/jobreaper/internal/pgcore"
)

// PruneMinAge is the least age Prune accepts: 8 days. A reaped or cancelled
// job's marker lives 7 days in Redis from its reap, and while it may still
// refuse a task the job keeps its whole history (events, batch records),
// with one day of margin for clocks and marker repair.
const PruneMinAge = 8 * 24 * time.Hour

// PruneBatchSize is the most records one DELETE of Prune removes, so that
// no statement holds locks on, or writes WAL for, an unbounded number of
// rows; Prune repeats it until nothing is left.
const PruneBatchSize = 10000

// PruneParams say what Prune removes.
type PruneParams struct {
	// OlderThan: the history of jobs that finished (COMPLETED or FAILED)
	// before the database's now() minus OlderThan is removed. At least
	// PruneMinAge.
	OlderThan time.Duration
	// DryRun counts what would be removed and removes nothing.
	DryRun bool
	// BatchSize is the most rows one DELETE removes; 0 or more than
	// PruneBatchSize means PruneBatchSize.
	BatchSize int
	// Operator names who runs the prune (user@host), recorded in its
	// prune_runs row; may be "".
	Operator string
}

// PruneResult counts what Prune removed (or, in a dry run, would remove).
type PruneResult struct {
	Events  int64 `json:"events"`
	Batches int64 `json:"batches"`
	// Cutoff is the database time the jobs' finished_at was compared with.
	Cutoff time.Time `json:"cutoff"`
}

const pruneCutoffSQL = `SELECT now() - $1::interval`

const pruneCountSQL = `
SELECT (SELECT count(*) FROM {schema}.job_events e JOIN {schema}.jobs j ON j.id = e.job_id
         WHERE j.status IN ('COMPLETED', 'FAILED') AND j.finished_at < $1),
       (SELECT count(*) FROM {schema}.job_batches b JOIN {schema}.jobs j ON j.id = b.job_id
         WHERE j.status IN ('COMPLETED', 'FAILED') AND j.finished_at < $1)`

const pruneEventsSQL = `
DELETE FROM {schema}.job_events WHERE id IN (
    SELECT e.id FROM {schema}.job_events e JOIN {schema}.jobs j ON j.id = e.job_id
     WHERE j.status IN ('COMPLETED', 'FAILED') AND j.finished_at < $1
     LIMIT $2)`

const pruneRecordSQL = `
INSERT INTO {schema}.prune_runs (older_than, cutoff, events, batches, complete, operator)
VALUES ($1, $2, $3, $4, $5, nullif($6, ''))`

const pruneBatchesSQL = `
DELETE FROM {schema}.job_batches b USING (
    SELECT b2.job_id, b2.token FROM {schema}.job_batches b2 JOIN {schema}.jobs j ON j.id = b2.job_id
     WHERE j.status IN ('COMPLETED', 'FAILED') AND j.finished_at < $1
     LIMIT $2) d
 WHERE b.job_id = d.job_id AND b.token = d.token`

// Prune deletes the events and batch records of jobs that finished before
// the database's now() minus p.OlderThan, in DELETEs of at most
// p.BatchSize rows each, each its own statement (a long prune never holds
// one long transaction). It never deletes jobs rows: they are the
// product's. A job still QUEUED or PROCESSING keeps its history, and so
// does a job whose row was deleted (its ID may start a new life, which
// reads them). The cutoff is taken once, at the start. Then it records the
// run in prune_runs (when, p.OlderThan, the cutoff, the counts, whether it
// ran to its end, p.Operator), also when a DELETE failed or ctx was
// cancelled after the cutoff was read; a dry run records nothing.
//
// Errors: pgcore.ErrInvalidArgument when p.OlderThan is below PruneMinAge (nothing
// sent); a wrapped driver error or the operation's timeout, per statement:
// what the earlier statements deleted stays deleted and is counted in the
// result returned with the error; an error naming prune_runs when the run
// could not be recorded (the deletions stand).
func (s *Store) Prune(ctx context.Context, p PruneParams) (PruneResult, error) {
	var res PruneResult
	if p.OlderThan < PruneMinAge {
		return res, fmt.Errorf("jobs.Prune: %s is less than %s (8 days: a marker lives 7 days, plus a day of margin): %w",
			p.OlderThan, PruneMinAge, pgcore.ErrInvalidArgument)
	}
	batch := p.BatchSize
	if batch <= 0 || batch > PruneBatchSize {
		batch = PruneBatchSize
	}
	cctx, done := s.core.Op(ctx, "Prune")
	err := s.core.DB().QueryRow(cctx, pruneCutoffSQL, pgcore.Interval(p.OlderThan)).Scan(&res.Cutoff)
	if err = done(err); err != nil {
		return res, err
	}
	if p.DryRun {
		cctx, done := s.core.Op(ctx, "Prune")
		err := s.core.DB().QueryRow(cctx, s.core.Q(pruneCountSQL), res.Cutoff).Scan(&res.Events, &res.Batches)
		return res, done(err)
	}
	err = s.pruneDelete(ctx, &res, batch)
	// Recorded even when ctx was cancelled: what was deleted stays so.
	rctx, done := s.core.Op(context.WithoutCancel(ctx), "Prune")
	_, rerr := s.core.DB().Exec(rctx, s.core.Q(pruneRecordSQL), pgcore.Interval(p.OlderThan), res.Cutoff, res.Events, res.Batches, err == nil, p.Operator)
	if rerr = done(rerr); rerr != nil {
		rerr = fmt.Errorf("recording the run in prune_runs (what was deleted stays deleted): %w", rerr)
	}
	return res, errors.Join(err, rerr)
}

// pruneDelete runs Prune's DELETEs, counting into res.
func (s *Store) pruneDelete(ctx context.Context, res *PruneResult, batch int) error {
	for _, step := range []struct {
		sql   string
		count *int64
	}{{s.core.Q(pruneEventsSQL), &res.Events}, {s.core.Q(pruneBatchesSQL), &res.Batches}} {
		for {
			cctx, done := s.core.Op(ctx, "Prune")
			tag, err := s.core.DB().Exec(cctx, step.sql, res.Cutoff, batch)
			if err = done(err); err != nil {
				return err
			}
			*step.count += tag.RowsAffected()
			if tag.RowsAffected() < int64(batch) {
				break
			}
		}
	}
	return nil
}
