package jobs

import "github.com/jobreaper/jobreaper/internal/pgcore"

// Cascade holds one job type's follow-up statements: OnFailed, OnCompleted
// and OnRequeued (yaml and koanf keys on_failed, on_completed,
// on_requeued), each a list of SQL statements with named arguments taken
// from the job row: @job_id, @parent_id, @tenant_id, @type (NULL columns
// are passed as NULL). OnFailed runs in the transaction that fails a job:
// Fail, a reap and an operator's cancel alike. OnCompleted runs in the
// transaction of Complete (CompleteWith, AutoComplete). OnRequeued runs in
// the transaction of `jobreaper requeue`, where the product resets its own
// status of a job that runs again.
type Cascade = pgcore.Cascade

// Cascades maps a job type name to its Cascade. Its Validate method checks
// every statement without a database (not empty, valid UTF-8 without NUL
// bytes, no named argument but those of CascadeArgNames), reporting each
// problem, wrapping ErrBadCascade, in a sentence naming the type, the hook
// and the statement number; Store.PrepareCascades runs it, then prepares
// each statement against the database.
type Cascades = pgcore.Cascades

// Cascade hook names, as in the config file and in error messages.
const (
	HookOnFailed    = "on_failed"
	HookOnCompleted = "on_completed"
	HookOnRequeued  = "on_requeued"
)

// CascadeArgNames are the named arguments a cascade statement may use, in
// the order error messages list them.
var CascadeArgNames = []string{"job_id", "parent_id", "tenant_id", "type"}
