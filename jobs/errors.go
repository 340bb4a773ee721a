package jobs

import (
	"errors"

	"github.com/jobreaper/jobreaper/internal/idcheck"
	"github.com/jobreaper/jobreaper/internal/pgcore"
)

// Sentinel errors of this package. Callers test them with errors.Is; the
// returned errors wrap them with the operation and job ID.
var (
	// ErrUnknownType: no job_types row names the job's type. The reaper
	// skips such a job as unknown_type on every pass, so queue.Enqueue
	// refuses to enqueue it: register the type (INSERT INTO job_types)
	// first.
	ErrUnknownType = errors.New("job type is not registered in job_types")

	// ErrClaimLost: the claim matched 0 rows because another worker claimed
	// the same generation first, or the job is no longer QUEUED/PROCESSING.
	ErrClaimLost = errors.New("claim lost: the job was claimed by another attempt or is terminal")

	// ErrStaleWorker: a fenced write named a generation that is no longer the
	// job's: a newer attempt claimed it. Code "stale_worker".
	ErrStaleWorker = errors.New("stale worker: the job was claimed by a newer attempt")

	// ErrTokenConflict: a batch token was recorded before with another
	// expected cursor or count. Code "token_conflict".
	ErrTokenConflict = errors.New("batch token was recorded with other content")

	// ErrCursorMismatch: Advance's expected cursor is not the stored cursor.
	// Code "cursor_mismatch".
	ErrCursorMismatch = errors.New("expected cursor does not match the stored cursor")

	// ErrOutOfRange: cursor + count would pass total, or SetTotal would go
	// below the cursor. Code "out_of_range".
	ErrOutOfRange = errors.New("cursor would pass the job's total")

	// ErrNoLease: the context carries no lease; the handler did not run
	// under the start guard.
	ErrNoLease = errors.New("no lease in context: the handler must run under the start guard")

	// ErrNotCompleted: CheckCompleted found the job still PROCESSING at the
	// lease's generation: it was not completed (yet), so nothing that must
	// follow a completion may be written.
	ErrNotCompleted = errors.New("job is not completed by this attempt")

	// ErrNotAutoComplete: AutoComplete found the job PROCESSING at the
	// lease's generation but its type is not marked auto_complete (or has no
	// job_types row). Nothing was written; the caller fails the job with
	// ReasonNoCompletion.
	ErrNotAutoComplete = errors.New("job type is not auto-complete: the handler returned without a confirmed Complete")

	// ErrNotFound: no job row with that ID exists.
	ErrNotFound = pgcore.ErrNotFound

	// ErrJobTerminal: a fenced write found the job COMPLETED or FAILED (for
	// example reaped). Code "job_terminal".
	ErrJobTerminal = pgcore.ErrJobTerminal

	// ErrCommitUnknown: jobreaper sent a transaction's COMMIT and no answer
	// came back (a timeout, a broken connection), so the transaction may or
	// may not have committed. Retry: a committed CompleteWith answers
	// Replayed, and fenced writes refuse what already happened.
	ErrCommitUnknown = pgcore.ErrCommitUnknown

	// ErrInvalidArgument: a caller passed a value the operation never
	// accepts (an empty batch token, a count below 1, a failure code that is
	// not a short snake_case identifier); nothing was sent to PostgreSQL.
	ErrInvalidArgument = pgcore.ErrInvalidArgument

	// ErrBadCascade: a cascade statement is empty, uses a named argument
	// other than @job_id, @parent_id, @tenant_id and @type, or does not
	// prepare against the database. The error names the type, the hook and
	// the statement number.
	ErrBadCascade = pgcore.ErrBadCascade

	// ErrTxEnded: a statement run inside one of jobreaper's transactions
	// (an operator's cascade with COMMIT or ROLLBACK, or a caller's
	// function given to CompleteWith or AfterCompleted) ended that
	// transaction before jobreaper's COMMIT. What ran before it was
	// committed or rolled back by that statement and what ran after it ran
	// outside any transaction, so the operation is not reported as done:
	// its UPDATE, its event and its cascade did not commit together. It
	// also stands for a transaction left failed by a statement whose error
	// was not returned. PrepareCascades refuses cascade statements that
	// control transactions at start; this error is the backstop for one
	// that slipped through.
	ErrTxEnded = pgcore.ErrTxEnded

	// ErrBadID: a job ID that PostgreSQL cannot store in a text column (a
	// NUL byte, bytes that are not valid UTF-8), an empty one, or one
	// longer than MaxIDLength (see CheckID). Nothing was sent.
	ErrBadID = idcheck.ErrBadID
)

// ErrorCode returns the stable code of a fencing or progress error, for
// events, metrics and logs: stale_worker, job_terminal, token_conflict,
// cursor_mismatch, out_of_range; "" for any other error.
func ErrorCode(err error) string {
	switch {
	case errors.Is(err, ErrStaleWorker):
		return "stale_worker"
	case errors.Is(err, ErrJobTerminal):
		return "job_terminal"
	case errors.Is(err, ErrTokenConflict):
		return "token_conflict"
	case errors.Is(err, ErrCursorMismatch):
		return "cursor_mismatch"
	case errors.Is(err, ErrOutOfRange):
		return "out_of_range"
	}
	return ""
}
