package queue

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/hibiken/asynq"

	"github.com/jobreaper/jobreaper/jobs"
)

// admitter reads a job row and claims it in one statement; *jobs.Store
// satisfies it (jobs.Store.Admit).
type admitter interface {
	Admit(ctx context.Context, req jobs.AdmitRequest) (jobs.Admission, error)
}

// admitterOf returns the one-statement admission of store when store is a
// *jobs.Store, else nil. Only the Store itself qualifies: a type that
// embeds one to change what Get or Claim does would otherwise be admitted
// past the methods it changed, so such a GuardStore is used through Get
// and Claim (two PostgreSQL round trips).
func admitterOf(store GuardStore) admitter {
	if s, ok := store.(*jobs.Store); ok && s != nil {
		return s
	}
	return nil
}

// admitOneTrip is steps 2-4 of Middleware with one Redis and one
// PostgreSQL round trip: the marker first, then jobs.Store.Admit decides
// on the row as it stands after any lock wait and claims in the same
// statement. The answers match the two-step path's: a row that is
// missing, COMPLETED or FAILED is answered from the row even when the
// marker could not be read (the statement then claims nothing), and a
// marker that cannot be read or holds a foreign value never lets the
// handler run.
func (g *Guard) admitOneTrip(ctx context.Context, log *slog.Logger, id string) (jobs.Lease, bool, error) {
	marked, found, markerErr := g.markers.Get(ctx, id)
	adm, err := g.admitter.Admit(ctx, jobs.AdmitRequest{
		JobID: id, Worker: g.worker, Marker: marked, HasMarker: markerErr == nil && found,
		Claim: markerErr == nil,
	})
	if err != nil {
		return g.unavailable(ctx, log, id, "reading and claiming the job row", err)
	}
	if adm.Outcome != jobs.AdmitNoRow {
		log = log.With("generation", adm.Generation)
	}
	switch adm.Outcome {
	case jobs.AdmitNoRow:
		return g.noRow(ctx, log, id, fmt.Errorf("job %s: %w", id, jobs.ErrNotFound))
	case jobs.AdmitCompleted:
		return g.ackCompleted(ctx, log)
	case jobs.AdmitFailed:
		return g.refuseFailed(ctx, log, id, adm.Generation, adm.FailureReason)
	}
	if errors.Is(markerErr, ErrBadMarker) {
		return g.badMarker(ctx, log, id, markerErr)
	}
	if markerErr != nil {
		return g.unavailable(ctx, log, id, "reading the marker", markerErr)
	}
	switch adm.Outcome {
	case jobs.AdmitMarked:
		return g.refuseMarked(ctx, log, id, adm.Generation, marked)
	case jobs.AdmitLost:
		return g.claimLost(ctx, log, fmt.Errorf("job %s generation %d: %w", id, adm.Generation, jobs.ErrClaimLost))
	case jobs.AdmitClaimed:
		return g.claimed(ctx, log, adm.Lease)
	}
	return g.unavailable(ctx, log, id, "reading and claiming the job row",
		fmt.Errorf("unexpected admission outcome %d", adm.Outcome))
}

func (g *Guard) noRow(ctx context.Context, log *slog.Logger, id string, err error) (jobs.Lease, bool, error) {
	g.count(decisionNoRow)
	log.WarnContext(ctx, "task not started: no job row yet", "reason", "no_row")
	return jobs.Lease{}, false, fmt.Errorf("queue.Guard: job %s: no job row, will retry: %w", id, err)
}

func (g *Guard) ackCompleted(ctx context.Context, log *slog.Logger) (jobs.Lease, bool, error) {
	g.count(decisionAckedCompleted)
	log.InfoContext(ctx, "task acknowledged without running: job already completed", "reason", "completed")
	return jobs.Lease{}, false, nil
}

func (g *Guard) refuseFailed(ctx context.Context, log *slog.Logger, id string, generation int64, failureReason string) (jobs.Lease, bool, error) {
	sentinel, decision, reason := ErrJobFailed, decisionRefusedFailed, "failed"
	if failureReason == jobs.ReasonStalled || failureReason == jobs.ReasonLostTask {
		sentinel, decision, reason = ErrJobReaped, decisionRefusedReaped, "reaped"
	}
	g.count(decision)
	log.WarnContext(ctx, "task refused: job is FAILED", "reason", reason, "failure_reason", failureReason)
	return jobs.Lease{}, false, fmt.Errorf("queue.Guard: job %s generation %d is FAILED (%s): %w: %w",
		id, generation, failureReason, sentinel, asynq.SkipRetry)
}

// badMarker: someone else wrote the key. Retrying cannot fix it, so it is
// not "unavailable" (retried forever, uncounted): a counted failure that
// asynq retries with its backoff while the key is deleted, and archives
// once the task's retries are used up.
func (g *Guard) badMarker(ctx context.Context, log *slog.Logger, id string, err error) (jobs.Lease, bool, error) {
	g.count(decisionBadMarker)
	log.ErrorContext(ctx, "task not started: its marker key holds a value jobreaper never writes; delete the key",
		"reason", "bad_marker", "key", MarkerKey(id), "err", err)
	return jobs.Lease{}, false, fmt.Errorf("queue.Guard: job %s: %w", id, err)
}

func (g *Guard) refuseMarked(ctx context.Context, log *slog.Logger, id string, generation, marked int64) (jobs.Lease, bool, error) {
	g.count(decisionRefusedReaped)
	if marked > generation {
		// No reap of this row set it: a reap of generation g leaves the
		// row at g, and every later attempt of the row is above g. The
		// task is still refused (the guard fails closed), and the log
		// says where such a marker comes from.
		log.WarnContext(ctx, "task refused: marker records a generation above the row's, so it was set for another row with this job ID: "+
			"another schema on the same Redis database (marker keys name no schema), or the row was deleted and inserted again with a lower generation; see docs/redis.md#one-schema-per-redis-database",
			"reason", "marker", "marker_generation", marked)
	} else {
		log.WarnContext(ctx, "task refused: marker records a reap of this generation",
			"reason", "marker", "marker_generation", marked)
	}
	return jobs.Lease{}, false, fmt.Errorf("queue.Guard: job %s generation %d: marker %s records generation %d: %w: %w",
		id, generation, MarkerKey(id), marked, ErrJobReaped, asynq.SkipRetry)
}

func (g *Guard) claimLost(ctx context.Context, log *slog.Logger, err error) (jobs.Lease, bool, error) {
	g.count(decisionClaimLost)
	log.WarnContext(ctx, "task refused: another attempt claimed the job first", "reason", "claim_lost")
	return jobs.Lease{}, false, fmt.Errorf("queue.Guard: %w: %w", err, asynq.SkipRetry)
}

func (g *Guard) claimed(ctx context.Context, log *slog.Logger, lease jobs.Lease) (jobs.Lease, bool, error) {
	g.count(decisionClaimed)
	log.DebugContext(ctx, "job claimed", "lease_generation", lease.Generation, "worker", g.worker)
	g.checkDeadline(ctx, log, lease)
	return lease, true, nil
}
