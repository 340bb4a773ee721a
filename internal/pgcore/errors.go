package pgcore

import "errors"

// The errors the worker library and the daemon's statements share. Package
// jobs exports each under the same name (jobs.ErrNotFound is ErrNotFound),
// so a worker tests them with errors.Is against jobs' names.
var (
	// ErrNotFound: no job row with that ID exists.
	ErrNotFound = errors.New("job not found")

	// ErrJobTerminal: a fenced write found the job COMPLETED or FAILED (for
	// example reaped), or an operator's cancel found it so. Code
	// "job_terminal".
	ErrJobTerminal = errors.New("job is terminal: it was completed, failed or reaped")

	// ErrCommitUnknown: jobreaper sent a transaction's COMMIT and no answer
	// came back (a timeout, a broken connection), so the transaction may or
	// may not have committed.
	ErrCommitUnknown = errors.New("commit outcome unknown")

	// ErrInvalidArgument: a caller passed a value the operation never
	// accepts; nothing was sent to PostgreSQL.
	ErrInvalidArgument = errors.New("invalid argument")

	// ErrBadCascade: a cascade statement is empty, uses a named argument
	// other than @job_id, @parent_id, @tenant_id and @type, or does not
	// prepare against the database. The error names the type, the hook and
	// the statement number.
	ErrBadCascade = errors.New("bad cascade statement")
)
