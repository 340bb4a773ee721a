// Package jobs is the PostgreSQL side of jobreaper's worker library, for the
// asynq workers and producers whose jobs jobreaper keeps honest: Connect and
// Migrate, and a Store over jobreaper's tables with the calls a worker makes.
//
// The start guard (package queue) claims a job and puts the attempt's Lease
// into the handler's context (LeaseFromContext). The handler reports
// liveness through a Heartbeater (rate-limited, moving updated_at only when
// a progress mark advanced) and resumable progress through Store.Advance and
// Store.SetTotal (batch tokens replay); it completes with Store.Complete or
// Store.CompleteWith (completion as the first write of the transaction that
// writes its product rows), writes what must follow a confirmed completion
// with Store.CheckCompleted or Store.AfterCompleted, and fails with
// Store.Fail. The guard's outcome mapping uses Store.Release and
// Store.AutoComplete; a producer's queue.Enqueue reads the row with
// Store.Get. The per-type cascades (WithCascades) run inside the
// transaction that changes a job.
//
// Every write that belongs to an attempt is fenced by the attempt's
// generation: its WHERE names status PROCESSING and the generation the claim
// returned, so a superseded or reaped attempt changes 0 rows, gets
// ErrStaleWorker or ErrJobTerminal, and leaves a late_result_rejected event.
//
// The daemon's and the operator commands' statements (loading rows,
// reaping, markers, the leader lease, holds, inspect, requeue, cancel,
// prune) are internal to jobreaper. The package imports neither queue nor
// reaper; both depend on it.
package jobs
