package jobs

import (
	"context"
	"errors"
	"fmt"
	"math"

	"github.com/jackc/pgx/v5"
)

// MaxBatchTokenLength bounds a batch token (bytes). Tokens are names the
// caller derives from the batch ("page-17", "items-300-400"), not payloads.
const MaxBatchTokenLength = 200

// AdvanceResult is the outcome of a successful Advance.
type AdvanceResult struct {
	// Cursor is the job's cursor after the batch: expectedCursor + count for
	// a new batch, the stored cursor_after for a replay.
	Cursor int64
	// Replayed: the token was recorded before (by this or an earlier
	// generation) with the same expected cursor and count. Nothing was
	// written, and the caller must not write the batch's rows again: they
	// were committed with the first recording.
	Replayed bool
	// Generation is the generation that recorded the token: the lease's for
	// a new batch, possibly an earlier one for a replay.
	Generation int64
}

const advanceLockSQL = `
SELECT status, generation, coalesce(failure_reason, ''), "cursor", total, first_generation
  FROM {schema}.jobs WHERE id = $1 FOR UPDATE`

// batchByTokenSQL finds a token recorded in the job's current life: at a
// generation at or above the life's first. A token of an earlier life of
// the ID (the row was deleted and inserted again) is not a replay.
const batchByTokenSQL = `
SELECT generation, expected_cursor, count, cursor_after
  FROM {schema}.job_batches WHERE job_id = $1 AND token = $2 AND generation >= $3`

// recordBatchSQL records a new token. The same token of an earlier life of
// the ID, the only one the lookup above lets through, is replaced.
const recordBatchSQL = `
INSERT INTO {schema}.job_batches AS b (job_id, token, generation, expected_cursor, count, cursor_after)
VALUES (@job_id, @token, @generation, @expected_cursor, @count, @cursor_after)
ON CONFLICT (job_id, token) DO UPDATE
   SET generation = EXCLUDED.generation, expected_cursor = EXCLUDED.expected_cursor,
       count = EXCLUDED.count, cursor_after = EXCLUDED.cursor_after, at = now()
 WHERE b.generation < @first_generation`

// moveCursorSQL moves the cursor and updated_at, and keeps the attempt's
// longest progress gap (keepIdleGapSQL) in the same statement.
const moveCursorSQL = `
UPDATE {schema}.jobs j SET "cursor" = @cursor_after, updated_at = now(), ` + keepIdleGapSQL + `
 WHERE j.id = @job_id AND j.status = 'PROCESSING' AND j.generation = @generation AND j."cursor" = @expected_cursor`

// Advance records one batch of resumable progress: the cursor moves from
// expectedCursor to expectedCursor + count. It runs in the caller's
// transaction tx and must be its first write, so that the batch's product
// rows, written after it in tx, and the cursor commit together or not at
// all; a rolled-back tx leaves neither. It locks the job row (SELECT ... FOR
// UPDATE) until tx ends, so concurrent Advances of one job run one after the
// other and a token is recorded once.
//
// A committed batch is evidence of progress: it sets updated_at to the
// database's now() and, in the same UPDATE, keeps the attempt's longest
// progress gap (jobs.max_idle_gap). Advance is never throttled. A NULL total (the job was
// created without one) sets no upper bound.
//
// Checks, in order, each returning an error (tx must then be rolled back):
//   - a generation other than the lease's: ErrStaleWorker, with a
//     late_result_rejected event written outside tx;
//   - token recorded before for this job, by any generation of the job's
//     current life (not by an earlier life of a reused ID): the same
//     expectedCursor and count return the stored cursor with Replayed, even
//     when the job has ended since; other content returns ErrTokenConflict;
//   - status not PROCESSING: ErrJobTerminal (COMPLETED or FAILED) or
//     ErrStaleWorker (released to the queue), with a late_result_rejected
//     event;
//   - expectedCursor not the stored cursor: ErrCursorMismatch;
//   - cursor + count past total: ErrOutOfRange.
//
// Also: ErrInvalidArgument for an empty or over-long token, a count below 1
// or a negative expectedCursor (nothing sent); ErrNotFound for a missing
// row; otherwise a wrapped driver error or the operation's timeout.
func (s *Store) Advance(ctx context.Context, tx pgx.Tx, lease Lease, token string, expectedCursor, count int64) (AdvanceResult, error) {
	ctx, done := s.core.Op(ctx, "Advance")
	switch {
	case token == "" || len(token) > MaxBatchTokenLength:
		return AdvanceResult{}, done(fmt.Errorf("job %s: batch token must be 1 to %d bytes, got %d: %w",
			lease.JobID, MaxBatchTokenLength, len(token), ErrInvalidArgument))
	case count < 1:
		return AdvanceResult{}, done(fmt.Errorf("job %s: batch %q count must be at least 1, got %d: %w",
			lease.JobID, token, count, ErrInvalidArgument))
	case expectedCursor < 0:
		return AdvanceResult{}, done(fmt.Errorf("job %s: batch %q expected cursor must not be negative, got %d: %w",
			lease.JobID, token, expectedCursor, ErrInvalidArgument))
	}

	var (
		st               jobState
		cursor, firstGen int64
		total            *int64
	)
	err := lockedRead(func() error {
		return tx.QueryRow(ctx, s.core.Q(advanceLockSQL), lease.JobID).Scan(&st.Status, &st.Generation, &st.FailureReason, &cursor, &total, &firstGen)
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return AdvanceResult{}, done(fmt.Errorf("job %s: %w", lease.JobID, ErrNotFound))
	}
	if err != nil {
		return AdvanceResult{}, done(err)
	}
	if st.Generation != lease.Generation {
		return AdvanceResult{}, done(s.rejectLate(ctx, "Advance", lease, st, fenceError(lease, st)))
	}

	var rec struct{ generation, expected, count, after int64 }
	err = tx.QueryRow(ctx, s.core.Q(batchByTokenSQL), lease.JobID, token, firstGen).Scan(&rec.generation, &rec.expected, &rec.count, &rec.after)
	switch {
	case err == nil && rec.expected == expectedCursor && rec.count == count:
		return AdvanceResult{Cursor: rec.after, Replayed: true, Generation: rec.generation}, done(nil)
	case err == nil:
		return AdvanceResult{}, done(fmt.Errorf(
			"job %s: batch %q was recorded by generation %d at cursor %d with count %d, not at cursor %d with count %d: %w",
			lease.JobID, token, rec.generation, rec.expected, rec.count, expectedCursor, count, ErrTokenConflict))
	case !errors.Is(err, pgx.ErrNoRows):
		return AdvanceResult{}, done(err)
	}

	if ferr := fenceError(lease, st); ferr != nil {
		return AdvanceResult{}, done(s.rejectLate(ctx, "Advance", lease, st, ferr))
	}
	if expectedCursor != cursor {
		return AdvanceResult{}, done(fmt.Errorf("job %s: batch %q expects cursor %d, the stored cursor is %d: %w",
			lease.JobID, token, expectedCursor, cursor, ErrCursorMismatch))
	}
	if count > math.MaxInt64-cursor || (total != nil && cursor+count > *total) {
		return AdvanceResult{}, done(fmt.Errorf("job %s: batch %q of %d items at cursor %d passes total %s: %w",
			lease.JobID, token, count, cursor, formatTotal(total), ErrOutOfRange))
	}

	after := cursor + count
	args := namedLease(lease, "token", token, "expected_cursor", expectedCursor, "count", count, "cursor_after", after,
		"first_generation", firstGen)
	tag, err := tx.Exec(ctx, s.core.Q(recordBatchSQL), args)
	if err != nil {
		return AdvanceResult{}, done(fmt.Errorf("recording batch %q of job %s: %w", token, lease.JobID, err))
	}
	if tag.RowsAffected() != 1 {
		// Unreachable while the row lock is held: the lookup found no
		// record of this life, so a conflict can only be an earlier life's.
		return AdvanceResult{}, done(fmt.Errorf("job %s: batch %q is recorded in this life although the lookup found none", lease.JobID, token))
	}
	tag, err = tx.Exec(ctx, s.core.Q(moveCursorSQL), args)
	if err != nil {
		return AdvanceResult{}, done(fmt.Errorf("moving the cursor of job %s: %w", lease.JobID, err))
	}
	if tag.RowsAffected() != 1 {
		// Unreachable while the row lock is held; refuse rather than guess.
		return AdvanceResult{}, done(fmt.Errorf("job %s changed under its row lock while recording batch %q", lease.JobID, token))
	}
	return AdvanceResult{Cursor: after, Generation: lease.Generation}, done(nil)
}

func formatTotal(total *int64) string {
	if total == nil {
		return "none"
	}
	return fmt.Sprint(*total)
}

const setTotalSQL = `
UPDATE {schema}.jobs SET total = @total
 WHERE id = @job_id AND status = 'PROCESSING' AND generation = @generation AND "cursor" <= @total`

// SetTotal sets the number of items lease's job covers, for a job whose
// total grows while it runs (a crawl that discovers pages). It is fenced
// (PROCESSING at the lease's generation) and may move total anywhere at or
// above the cursor, never below it. It does not move updated_at: a larger
// total is not progress.
//
// Errors: ErrOutOfRange when total is below the stored cursor;
// ErrStaleWorker or ErrJobTerminal when the attempt is over, with a
// late_result_rejected event; ErrInvalidArgument for a negative total;
// ErrNotFound for a missing row; otherwise a wrapped driver error.
func (s *Store) SetTotal(ctx context.Context, lease Lease, total int64) error {
	ctx, done := s.core.Op(ctx, "SetTotal")
	if total < 0 {
		return done(fmt.Errorf("job %s: total must not be negative, got %d: %w", lease.JobID, total, ErrInvalidArgument))
	}
	tag, err := s.core.DB().Exec(ctx, s.core.Q(setTotalSQL), namedLease(lease, "total", total))
	if err != nil {
		return done(err)
	}
	if tag.RowsAffected() == 1 {
		return done(nil)
	}
	if _, err := s.refuse(ctx, s.core.DB(), "SetTotal", lease); err != nil {
		return done(err)
	}
	var cursor int64
	if err := s.core.DB().QueryRow(ctx, s.core.Q(`SELECT "cursor" FROM {schema}.jobs WHERE id = $1`), lease.JobID).Scan(&cursor); err != nil {
		return done(err)
	}
	return done(fmt.Errorf("job %s: total %d is below the cursor %d: %w", lease.JobID, total, cursor, ErrOutOfRange))
}
