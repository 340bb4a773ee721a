package pgstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/jobreaper/jobreaper/internal/idcheck"
	"github.com/jobreaper/jobreaper/internal/pgcore"
)

// EventCancelled is the kind of the event Cancel writes, in the transaction
// that failed the job; its detail is a CancelDetail.
const EventCancelled = "cancelled"

// MaxOperatorReasonLength bounds the --reason text of an operator command
// (bytes): it is stored in the command's event, read by people, and never
// parsed.
const MaxOperatorReasonLength = 1000

// CancelDetail is the detail of a "cancelled" event.
type CancelDetail struct {
	// Reason is the operator's --reason text.
	Reason string `json:"reason"`
	// PreviousStatus is QUEUED or PROCESSING: the status the job was
	// cancelled from.
	PreviousStatus string `json:"previous_status"`
	// Operator names who ran the command (user@host), "" when unknown.
	Operator string `json:"operator,omitempty"`
}

// CancelParams name the job to cancel and why.
type CancelParams struct {
	JobID string
	// Reason is the operator's text, required (see CheckOperatorReason).
	Reason string
	// Operator names who ran the command, for the event; may be "".
	Operator string
}

// CancelResult is what Cancel changed.
type CancelResult struct {
	// PreviousStatus is QUEUED or PROCESSING (with pgcore.ErrJobTerminal: the
	// status that refused the cancel, COMPLETED or FAILED).
	PreviousStatus string
	// Generation is the job's generation, unchanged by the cancel: the
	// marker records it, and every write of that attempt is refused.
	Generation int64
	// Type and Queue are the job's ("" when the row has no queue).
	Type, Queue string
	// DBNow is the database's now() of the cancel; the marker's 7 days run
	// from it.
	DBNow time.Time
}

// CheckOperatorReason reports whether text may be stored as an operator
// command's reason: not blank, at most MaxOperatorReasonLength bytes, valid
// text PostgreSQL can store (no NUL byte). The error wraps
// pgcore.ErrInvalidArgument.
func CheckOperatorReason(text string) error {
	switch {
	case strings.TrimSpace(text) == "":
		return fmt.Errorf("the reason is empty: say why: %w", pgcore.ErrInvalidArgument)
	case len(text) > MaxOperatorReasonLength:
		return fmt.Errorf("the reason is %d bytes, more than %d: %w", len(text), MaxOperatorReasonLength, pgcore.ErrInvalidArgument)
	case strings.ContainsRune(text, 0) || !utf8.ValidString(text):
		return fmt.Errorf("the reason holds a NUL byte or invalid UTF-8: %w", pgcore.ErrInvalidArgument)
	}
	return nil
}

const cancelReadSQL = `
SELECT status, generation, type, coalesce(queue, ''), coalesce(parent_id, ''), coalesce(tenant_id, '')
  FROM {schema}.jobs WHERE id = $1 FOR UPDATE`

// cancelSQL is fenced on the status and generation read under the row
// lock: nothing else can have moved them, and the statement says so.
const cancelSQL = `
UPDATE {schema}.jobs
   SET status = 'FAILED', failure_reason = 'cancelled', finished_at = now(), marker_set_at = NULL
 WHERE id = $1 AND status = $2 AND generation = $3
RETURNING now()`

// Cancel fails a QUEUED or PROCESSING job with failure code
// ReasonCancelled, on an operator's word. In one transaction it locks the
// row, fails it (fenced on the status and generation it read), appends a
// "cancelled" event carrying p.Reason, and runs the type's on_failed
// cascade, as a reap would. The job's generation is kept, so every later
// fenced write of the running attempt (Complete, Advance, Heartbeat, Fail)
// is refused with pgcore.ErrJobTerminal, and the marker the caller sets for that
// generation makes the start guard refuse the task. The caller sets the
// marker and cancels the running handler after the commit.
//
// Errors: pgcore.ErrInvalidArgument for a bad ID or reason (nothing sent);
// pgcore.ErrNotFound when no row has the ID; pgcore.ErrJobTerminal when the job is
// COMPLETED or FAILED (nothing written; the result then holds the job's
// status as PreviousStatus, its generation, type and queue, so that the
// refusal can say what it found); pgcore.ErrTxEnded when a cascade statement
// ended the transaction; a wrapped cascade or driver error otherwise
// (nothing written).
func (s *Store) Cancel(ctx context.Context, p CancelParams) (CancelResult, error) {
	ctx, done := s.core.Op(ctx, "Cancel")
	if err := idcheck.CheckID(p.JobID); err != nil {
		return CancelResult{}, done(err)
	}
	if err := CheckOperatorReason(p.Reason); err != nil {
		return CancelResult{}, done(fmt.Errorf("job %s: %w", p.JobID, err))
	}
	var res CancelResult
	err := s.core.InTx(ctx, func(tx pgx.Tx) error {
		var ca pgcore.CascadeArgs
		err := tx.QueryRow(ctx, s.core.Q(cancelReadSQL), p.JobID).Scan(&res.PreviousStatus, &res.Generation,
			&ca.Type, &res.Queue, &ca.ParentID, &ca.TenantID)
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("job %s: %w", p.JobID, pgcore.ErrNotFound)
		}
		if err != nil {
			return err
		}
		res.Type = ca.Type
		if res.PreviousStatus != StatusQueued && res.PreviousStatus != StatusProcessing {
			return fmt.Errorf("job %s is %s; only a QUEUED or PROCESSING job can be cancelled: %w",
				p.JobID, res.PreviousStatus, pgcore.ErrJobTerminal)
		}
		if err := tx.QueryRow(ctx, s.core.Q(cancelSQL), p.JobID, res.PreviousStatus, res.Generation).Scan(&res.DBNow); err != nil {
			return err
		}
		detail, err := json.Marshal(CancelDetail{Reason: p.Reason, PreviousStatus: res.PreviousStatus, Operator: p.Operator})
		if err != nil {
			return err
		}
		if err := s.core.AppendEvent(ctx, tx, p.JobID, EventCancelled, res.Generation, "", detail); err != nil {
			return err
		}
		ca.JobID = p.JobID
		return s.core.RunFailed(ctx, tx, ca)
	})
	if errors.Is(err, pgcore.ErrJobTerminal) {
		return CancelResult{PreviousStatus: res.PreviousStatus, Generation: res.Generation, Type: res.Type, Queue: res.Queue}, done(err)
	}
	if err != nil {
		return CancelResult{}, done(err)
	}
	return res, done(nil)
}
