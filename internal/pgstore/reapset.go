package pgstore

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/jobreaper/jobreaper/internal/failpoint"
	"github.com/jobreaper/jobreaper/internal/pgcore"
)

// ReapBatchSize is the most candidates one ReapBatch transaction names. It
// bounds how many rows one transaction holds locked while its cascades run,
// and how much work a deadlock (retried next pass) throws away; 1,000 rows
// cost a few milliseconds of statement time.
const ReapBatchSize = 1000

// ReapDropsMax bounds how many candidates whose own cascade fails one
// ReapBatch call sets aside before it gives up on the rest of its batch:
// each one costs a rolled-back transaction.
const ReapDropsMax = 8

// pgerrIdleInTransactionTimeout is PostgreSQL's SQLSTATE for a session it
// ended because its transaction sat idle past
// idle_in_transaction_session_timeout.
const pgerrIdleInTransactionTimeout = "25P03"

// ErrDeadlock: PostgreSQL broke a deadlock by rolling back the reap
// transaction (an operator cascade locked parent rows in another order than
// a concurrent transaction). Nothing of the batch was written; the next
// pass reaps what is still stalled.
var ErrDeadlock = errors.New("deadlock: the reap transaction was rolled back")

// ReapCandidate is one job to reap and the state it was read in: the reap
// changes nothing when its generation or updated_at moved since.
type ReapCandidate struct {
	JobID      string
	Generation int64
	UpdatedAt  time.Time
	// Retry makes the reap a retry reap (the reaper's DecideRetry said
	// so): the row goes back to QUEUED with its generation and reap_count
	// raised, its finished_at cleared, and no cascade runs. The
	// compare-and-set then also repeats that the type's budget is not
	// spent (reap_count < reap_retries).
	Retry bool
	// RetryImpossible, for a failing reap, records reap_retry_impossible
	// in its event: the budget was not spent but asynq holds no task to
	// run again.
	RetryImpossible bool
}

// ReapBatchParams names the candidates of one set-based reap.
type ReapBatchParams struct {
	// Candidates, at most ReapBatchSize, in any order, each ID once.
	Candidates []ReapCandidate
	// Reason is ReasonStalled or ReasonLostTask.
	Reason string
	Rule   StallRule
	// DeadEarly: the candidates are dead attempts of types that opted into
	// reap_dead_early (Reason ReasonLostTask); the compare-and-set
	// re-checks DeadEarlyPredicate instead of StallPredicate, and each
	// event's evidence says dead_early.
	DeadEarly bool
}

// ReapedJob is a job ReapBatch failed.
type ReapedJob struct {
	JobID    string
	Type     string
	Evidence Evidence
	// Retry is true for a retry reap: the row is QUEUED at
	// Evidence.Generation + 1, Evidence.ReapCount retries into its
	// budget of Evidence.ReapRetries.
	Retry bool
	// RetryDelay is the type's reap_retry_delay.
	RetryDelay time.Duration
	// parentID and tenantID are the cascade's @parent_id and @tenant_id.
	parentID, tenantID string
}

// ReapFailure is a candidate whose own cascade failed: nothing was written
// for it, the rest of the batch was reaped without it.
type ReapFailure struct {
	JobID string
	Err   error
}

// ReapBatchResult says what happened to each candidate of a ReapBatch.
type ReapBatchResult struct {
	// Reaped lists the jobs failed, in ID order, with their evidence.
	Reaped []ReapedJob
	// Changed lists, in ID order, the candidates whose compare-and-set
	// matched nothing: the job progressed, was reclaimed or finished, or its
	// type's limits were raised since the read. Nothing was written for
	// them.
	Changed []string
	// Failed lists the candidates whose on_failed cascade failed; nothing
	// was written for them and the next pass tries again.
	Failed []ReapFailure
}

// reapLockSQL takes the row locks of a batch in ID order (LockRows runs
// above the sort), so two reapers never wait on each other in a cycle.
const reapLockSQL = `
SELECT j.id FROM {schema}.jobs j WHERE j.id = ANY(@ids::text[]) ORDER BY j.id FOR UPDATE`

// reapBatchSQL is the set-based compare-and-set, run after reapLockSQL in
// the same transaction (so it reads the rows as last committed): it
// repeats per row the generation and updated_at that were read and the
// whole StallPredicate on now(). Rows are named by id = ANY(@ids), which
// only the primary key serves (see StallPredicate and pinPlansSQL). The
// intervals are returned as intervals, converted in Go the way PostgreSQL
// compares them (30-day months, 24-hour days); extract(epoch) would count a
// year as 365.25 days.
//
// marker_set_at is set by the reap itself, not by a second UPDATE once the
// marker is written: that second write of every reaped row could not be a
// HOT update (marker_set_at is in jobs_marker_missing_idx's predicate) and
// cost as much as the reap's own UPDATE. The reaper clears it again, with
// MarkMarkersFailed, for the markers whose write failed, so that the next
// pass re-sets them; a marker lost between the commit and its write (the
// process killed there) is restored by the re-assertion of every marker of
// the last 7 days, within marker_check_window. Meanwhile the FAILED row
// refuses the task through the start guard.
//
// A candidate with retry set is a retry reap: the row goes back to QUEUED
// with its generation raised (every write of the reaped attempt is
// refused from then on), reap_count + 1 and finished_at cleared, its
// failure_reason and marker_set_at kept; the compare-and-set repeats that
// the budget is not spent. The RETURNING generation is the reaped
// attempt's, for both kinds.
const reapBatchSQL = `
UPDATE {schema}.jobs j
   SET status = CASE WHEN r.retry THEN 'QUEUED' ELSE 'FAILED' END,
       failure_reason = CASE WHEN r.retry THEN j.failure_reason ELSE @reason END,
       finished_at = CASE WHEN r.retry THEN NULL ELSE now() END,
       marker_set_at = CASE WHEN r.retry THEN j.marker_set_at ELSE now() END,
       generation = j.generation + CASE WHEN r.retry THEN 1 ELSE 0 END,
       reap_count = j.reap_count + CASE WHEN r.retry THEN 1 ELSE 0 END
  FROM unnest(@ids::text[], @generations::int8[], @updated_ats::timestamptz[], @retries::bool[])
       AS r(id, generation, updated_at, retry),
       {schema}.job_types t
 WHERE j.id = ANY(@ids::text[])
   AND r.id = j.id
   AND t.name = j.type
   AND j.generation = r.generation
   AND j.updated_at = r.updated_at
   AND (NOT r.retry OR j.reap_count < t.reap_retries)
   AND ` + StallPredicate + `
RETURNING j.id, j.generation - CASE WHEN r.retry THEN 1 ELSE 0 END, coalesce(j.worker, ''), j.type,
          coalesce(j.parent_id, ''), coalesce(j.tenant_id, ''),
          j.started_at, j.updated_at, now() - j.started_at, now() - j.updated_at,
          t.max_runtime, coalesce(t.stall_timeout, @default_stall), now(),
          greatest(j.max_idle_gap, now() - j.updated_at),
          r.retry, j.reap_count, t.reap_retries, t.reap_retry_delay`

// reapEventsSQL appends the reaped events of one batch, in ID order.
const reapEventsSQL = `
INSERT INTO {schema}.job_events (job_id, kind, generation, worker, detail)
SELECT e.id, 'reaped', e.generation, nullif(e.worker, ''), e.detail::jsonb
  FROM unnest(@ids::text[], @generations::int8[], @workers::text[], @details::text[]) AS e(id, generation, worker, detail)`

// ReapBatch fails the stalled jobs among p.Candidates in one transaction:
// the rows are locked in ID order (reapLockSQL), then one UPDATE
// (reapBatchSQL) changes only those whose generation, updated_at and stall rule still hold; one
// INSERT of their "reaped" events; then each changed row's on_failed
// cascade, once per row in ID order (two children of one parent change the
// parent twice), the event and the cascades sent in one pipeline. Before
// COMMIT the transaction's state is checked once (checkTxOpen). No plan
// depends on the statistics: every statement names jobs by the primary key.
//
// A candidate whose own cascade fails is set aside (ReapBatchResult.Failed)
// and the batch is run again without it, at most ReapDropsMax times.
//
// With WithLeaderLease, the transaction's last statement before COMMIT
// checks the leader lease on clock_timestamp(), locking its row until
// COMMIT, and rolls back otherwise; the transaction may sit idle for at
// most the leader lease's TTL (WithLeaderLeaseTTL).
//
// Errors (nothing of the batch written): ErrLeaderLeaseLost when the leader
// lease was no longer this daemon's at COMMIT, or when PostgreSQL ended the
// session because the transaction sat idle past that bound; ErrDeadlock when PostgreSQL broke
// a deadlock; pgcore.ErrTxEnded when a cascade statement ended the transaction;
// pgcore.ErrInvalidArgument for more than ReapBatchSize candidates; a wrapped
// driver or cascade error otherwise.
func (s *Store) ReapBatch(ctx context.Context, p ReapBatchParams) (ReapBatchResult, error) {
	ctx, done := s.core.Op(ctx, "ReapBatch")
	res, err := s.reapBatch(ctx, p)
	return res, done(err)
}

func (s *Store) reapBatch(ctx context.Context, p ReapBatchParams) (ReapBatchResult, error) {
	var res ReapBatchResult
	if len(p.Candidates) > ReapBatchSize {
		return res, fmt.Errorf("%d candidates, more than ReapBatchSize %d: %w", len(p.Candidates), ReapBatchSize, pgcore.ErrInvalidArgument)
	}
	cands := slices.SortedFunc(slices.Values(p.Candidates), func(a, b ReapCandidate) int { return cmp.Compare(a.JobID, b.JobID) })
	for len(cands) > 0 {
		reaped, failedAt, err := s.reapOnce(ctx, cands, p)
		if err == nil {
			res.Reaped = reaped
			res.Changed = changedSinceRead(cands, reaped)
			return res, nil
		}
		if failedAt == "" || len(res.Failed) >= ReapDropsMax {
			return ReapBatchResult{Failed: res.Failed}, err
		}
		res.Failed = append(res.Failed, ReapFailure{JobID: failedAt, Err: err})
		cands = slices.DeleteFunc(cands, func(c ReapCandidate) bool { return c.JobID == failedAt })
	}
	return res, nil
}

// reapOnce runs one reap transaction over cands (sorted by ID). When a
// cascade of one row failed, failedAt names that row.
func (s *Store) reapOnce(ctx context.Context, cands []ReapCandidate, p ReapBatchParams) (reaped []ReapedJob, failedAt string, err error) {
	n := len(cands)
	ids, gens, upd, retries := make([]string, n), make([]int64, n), make([]time.Time, n), make([]bool, n)
	impossible := map[string]bool{}
	for i, c := range cands {
		ids[i], gens[i], upd[i], retries[i] = c.JobID, c.Generation, c.UpdatedAt, c.Retry
		if c.RetryImpossible && !c.Retry {
			impossible[c.JobID] = true
		}
	}
	args := p.Rule.args()
	args["ids"], args["generations"], args["updated_ats"], args["reason"], args["retries"] = ids, gens, upd, p.Reason, retries
	err = s.core.InTx(ctx, func(tx pgx.Tx) error {
		// The idle bound, when there is a leader lease, rides in the same
		// pipeline as the row locks and the UPDATE.
		pre := append(s.leaderIdleBound(), pgcore.Before{SQL: s.core.Q(reapLockSQL), Args: []any{pgx.NamedArgs{"ids": ids}}})
		update := s.core.Q(reapBatchSQL)
		if p.DeadEarly {
			update = s.core.Q(reapBatchDeadEarlySQL)
		}
		rows, saved, err := pgcore.PinnedQuery(ctx, tx, update, args, pre...)
		if err != nil {
			return err
		}
		reaped, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (ReapedJob, error) {
			return scanReaped(row, p.Reason)
		})
		if err != nil || len(reaped) == 0 {
			return err
		}
		for i := range reaped {
			reaped[i].Evidence.DeadEarly = p.DeadEarly
			reaped[i].Evidence.ReapRetryImpossible = impossible[reaped[i].JobID]
			if end := p.Rule.OutageEnd; end.After(reaped[i].Evidence.UpdatedAt) {
				reaped[i].Evidence.OutageEnd = &end
			}
			if s.leader != nil {
				reaped[i].Evidence.HolderID = s.leader.holderID
			}
		}
		sortReaped(reaped)
		if failedAt, err = s.reapFollowUps(ctx, tx, reaped, saved); err != nil {
			return err
		}
		// The last statement before COMMIT: a leader whose leader lease
		// lapsed meanwhile (paused, or waiting on a row lock) writes nothing.
		if err := s.checkLeaderLease(ctx, tx); err != nil {
			return err
		}
		failpoint.Inject("reap-before-commit") // test builds only: after the check, before COMMIT
		if s.beforeReapCommit != nil {
			s.beforeReapCommit()
		}
		return nil
	})
	if err != nil {
		var pgErr *pgconn.PgError
		switch {
		case errors.As(err, &pgErr) && pgErr.Code == "40P01":
			err = fmt.Errorf("%w: %w", ErrDeadlock, err)
		case errors.As(err, &pgErr) && pgErr.Code == pgerrIdleInTransactionTimeout && s.leader != nil:
			// The idle bound (WithLeaderLeaseTTL) ended the session: this
			// leader stood still for a leader lease's TTL inside the
			// transaction, which PostgreSQL rolled back.
			err = fmt.Errorf("%w: the reap transaction sat idle longer than the leader lease's TTL (the process was paused?) and PostgreSQL ended its session: %w",
				ErrLeaderLeaseLost, err)
		}
		return nil, failedAt, err
	}
	return reaped, "", nil
}

// scanReaped reads one RETURNING row of reapBatchSQL.
func scanReaped(row pgx.CollectableRow, reason string) (ReapedJob, error) {
	var (
		r                              ReapedJob
		parent, tenant                 string
		runtime, idle, maxRun, stallTO pgtype.Interval
		gap, delay                     pgtype.Interval
	)
	ev := &r.Evidence
	var count, retries int32
	err := row.Scan(&r.JobID, &ev.Generation, &ev.Worker, &r.Type, &parent, &tenant,
		&ev.StartedAt, &ev.UpdatedAt, &runtime, &idle, &maxRun, &stallTO, &ev.DBNow, &gap,
		&r.Retry, &count, &retries, &delay)
	r.RetryDelay = pgcore.IntervalDuration(delay)
	ev.Retry, ev.ReapCount, ev.ReapRetries = r.Retry, int(count), int(retries)
	ev.Reason = reason
	ev.Runtime, ev.Idle = pgcore.IntervalDuration(runtime), pgcore.IntervalDuration(idle)
	ev.MaxIdleGap = pgcore.IntervalDuration(gap)
	ev.MaxRuntime, ev.StallTimeout = pgcore.IntervalDuration(maxRun), pgcore.IntervalDuration(stallTO)
	r.parentID, r.tenantID = parent, tenant
	return r, err
}

// reapFollowUps sends, in one pipeline, the reaped events of the batch and
// each reaped row's on_failed cascade in ID order. When a cascade statement
// fails it returns that row's ID with the error.
func (s *Store) reapFollowUps(ctx context.Context, tx pgx.Tx, reaped []ReapedJob, saved pgcore.SavedPlans) (failedAt string, err error) {
	n := len(reaped)
	ids, gens, workers, details := make([]string, n), make([]int64, n), make([]string, n), make([]string, n)
	for i, r := range reaped {
		d, err := r.Evidence.detail()
		if err != nil {
			return "", err
		}
		ids[i], gens[i], workers[i], details[i] = r.JobID, r.Evidence.Generation, r.Evidence.Worker, string(d)
	}
	batch := &pgx.Batch{}
	batch.Queue(pgcore.RestorePlansSQL, saved.Seqscan, saved.Nestloop, saved.CacheMode)
	batch.Queue(s.core.Q(reapEventsSQL), pgx.NamedArgs{"ids": ids, "generations": gens, "workers": workers, "details": details})
	type step struct {
		jobID string
		stmt  pgcore.CascadeStatement
	}
	var steps []step
	positional := map[string]positionalCascade{}
	for _, r := range reaped {
		if r.Retry {
			continue // a retry reap runs no on_failed cascade
		}
		a := pgcore.CascadeArgs{JobID: r.JobID, Type: r.Type, ParentID: r.parentID, TenantID: r.tenantID}
		for i, sql := range s.core.Cascades()[r.Type].OnFailed {
			pc, ok := positional[sql]
			if !ok {
				if pc, err = rewriteCascade(ctx, sql); err != nil {
					return "", fmt.Errorf("job %s: %s: %w", r.JobID, pgcore.CascadeStatement{Type: r.Type, Hook: pgcore.HookOnFailed, N: i + 1, SQL: sql}, err)
				}
				positional[sql] = pc
			}
			batch.Queue(pc.sql, pc.args(a)...)
			steps = append(steps, step{r.JobID, pgcore.CascadeStatement{Type: r.Type, Hook: pgcore.HookOnFailed, N: i + 1, SQL: sql}})
		}
	}
	br := tx.SendBatch(ctx, batch)
	if _, err := br.Exec(); err != nil {
		_ = br.Close()
		return "", fmt.Errorf("restoring the planner settings: %w", err)
	}
	if _, err := br.Exec(); err != nil {
		_ = br.Close()
		return "", fmt.Errorf("appending reaped events: %w", err)
	}
	for _, st := range steps {
		if _, err := br.Exec(); err != nil {
			_ = br.Close()
			return st.jobID, fmt.Errorf("job %s: %s: %w", st.jobID, st.stmt, err)
		}
	}
	return "", br.Close()
}

// changedSinceRead returns the IDs of cands (sorted) that are not in
// reaped (sorted).
func changedSinceRead(cands []ReapCandidate, reaped []ReapedJob) []string {
	var out []string
	i := 0
	for _, c := range cands {
		if i < len(reaped) && reaped[i].JobID == c.JobID {
			i++
			continue
		}
		out = append(out, c.JobID)
	}
	return out
}

// positionalCascade is a cascade statement with its named arguments
// rewritten to $1, $2, ... once per batch, instead of once per row: names
// lists which argument each position takes.
type positionalCascade struct {
	sql   string
	names []string
}

// rewriteCascade rewrites sql's named arguments with pgx's own rewriting,
// given each name as its own value, so that the rewritten arguments are
// the names in positional order.
func rewriteCascade(ctx context.Context, sql string) (positionalCascade, error) {
	named := pgx.NamedArgs{}
	for _, n := range pgcore.CascadeArgNames {
		named[n] = n
	}
	out, order, err := named.RewriteQuery(ctx, nil, sql, nil)
	if err != nil {
		return positionalCascade{}, err
	}
	pc := positionalCascade{sql: out, names: make([]string, len(order))}
	for i, v := range order {
		name, ok := v.(string)
		if !ok {
			return positionalCascade{}, fmt.Errorf("named argument %d of the cascade is not one of %v", i+1, pgcore.CascadeArgNames)
		}
		pc.names[i] = name
	}
	return pc, nil
}

// args returns a's values in pc's positional order.
func (pc positionalCascade) args(a pgcore.CascadeArgs) []any {
	out := make([]any, len(pc.names))
	for i, n := range pc.names {
		switch n {
		case "job_id":
			out[i] = a.JobID
		case "type":
			out[i] = a.Type
		case "parent_id":
			out[i] = pgcore.Nullable(a.ParentID)
		case "tenant_id":
			out[i] = pgcore.Nullable(a.TenantID)
		}
	}
	return out
}

// sortReaped sorts jobs by ID.
func sortReaped(jobs []ReapedJob) {
	slices.SortFunc(jobs, func(a, b ReapedJob) int { return cmp.Compare(a.JobID, b.JobID) })
}
