// Package jobs is the PostgreSQL side of jobreaper: the schema and its
// migrations, the claim that starts an attempt, the batched read the reaper
// decides on, and the reap, a compare-and-set that re-checks the stall rule
// in SQL on the database clock.
//
// It is also the worker library that asynq handlers link in: Heartbeater
// (rate-limited liveness that moves updated_at only when a progress mark
// advanced), Store.Advance and Store.SetTotal (resumable progress whose
// batch tokens replay), Store.Complete and Store.CompleteWith (completion as
// the first write of the transaction that writes its product rows),
// Store.CheckCompleted and Store.AfterCompleted (writes that follow a
// confirmed completion), Store.Fail, Store.Release and Store.AutoComplete
// (the writes the start guard's outcome mapping needs), and the per-type
// cascades that run inside the transaction that changed a job.
//
// Every write that belongs to an attempt is fenced by the attempt's
// generation: its WHERE names status PROCESSING and the generation the claim
// returned, so a superseded or reaped attempt changes 0 rows, gets
// ErrStaleWorker or ErrJobTerminal, and leaves a late_result_rejected event.
//
// The package imports neither queue nor reaper; both depend on it.
package jobs
