package jobs

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// Cascade holds one job type's follow-up statements. Each is SQL with named
// arguments taken from the job row: @job_id, @parent_id, @tenant_id, @type
// (NULL columns are passed as NULL).
type Cascade struct {
	// OnFailed runs in the transaction that fails a job: a reap, a lost-task
	// reap and Fail alike.
	OnFailed []string `yaml:"on_failed" koanf:"on_failed"`
	// OnCompleted runs in the transaction of Complete.
	OnCompleted []string `yaml:"on_completed" koanf:"on_completed"`
}

// Cascades maps a job type name to its Cascade.
type Cascades map[string]Cascade

// cascadeArgs are the named arguments a cascade statement may use.
type cascadeArgs struct {
	JobID, Type, ParentID, TenantID string
}

func (a cascadeArgs) named() pgx.NamedArgs {
	return pgx.NamedArgs{
		"job_id":    a.JobID,
		"type":      a.Type,
		"parent_id": nullable(a.ParentID),
		"tenant_id": nullable(a.TenantID),
	}
}

func nullable(s string) any {
	if s == "" {
		return nil
	}
	return s
}

func (c Cascades) runFailed(ctx context.Context, tx pgx.Tx, a cascadeArgs) error {
	return c.run(ctx, tx, a, "on_failed", c[a.Type].OnFailed)
}

func (c Cascades) runCompleted(ctx context.Context, tx pgx.Tx, a cascadeArgs) error {
	return c.run(ctx, tx, a, "on_completed", c[a.Type].OnCompleted)
}

func (c Cascades) run(ctx context.Context, tx pgx.Tx, a cascadeArgs, kind string, stmts []string) error {
	for i, stmt := range stmts {
		if _, err := tx.Exec(ctx, stmt, a.named()); err != nil {
			return fmt.Errorf("cascade %s of type %q, statement %d: %w", kind, a.Type, i+1, err)
		}
	}
	return nil
}
