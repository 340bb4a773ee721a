package queue

import (
	"context"
	"errors"
	"fmt"

	"github.com/hibiken/asynq"

	"github.com/jobreaper/jobreaper/jobs"
)

// settle maps the handler's result after an attempt the guard claimed.
// This is the minimal mapping; the full outcome mapping of DESIGN.md ("The
// worker side") replaces this file and keeps the signature:
//
//   - jobs.ErrJobTerminal or jobs.ErrStaleWorker from the handler: the job
//     was finished, reaped or claimed by a newer attempt, so a retry can
//     only be refused again; the error is wrapped with asynq.SkipRetry.
//   - anything else, nil included, is returned unchanged.
func (g *Guard) settle(ctx context.Context, lease jobs.Lease, err error) error {
	if errors.Is(err, jobs.ErrJobTerminal) || errors.Is(err, jobs.ErrStaleWorker) {
		g.logger.WarnContext(ctx, "attempt lost its job, task will not be retried",
			"job_id", lease.JobID, "generation", lease.Generation, "reason", jobs.ErrorCode(err))
		return fmt.Errorf("queue.Guard: job %s generation %d: %w: %w", lease.JobID, lease.Generation, err, asynq.SkipRetry)
	}
	return err
}
