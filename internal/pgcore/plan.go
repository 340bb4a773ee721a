package pgcore

import (
	"context"

	"github.com/jackc/pgx/v5"
)

// A statement that names jobs by an array of IDs must read them through the
// primary key, whatever the statistics say. Two things get in the way:
//
//   - PostgreSQL hashes a large = ANY(array), so a sequential scan costs
//     little per row, and on stale statistics (a table analyzed small or
//     empty, autovacuum waiting for 10 % of it to change) it looks cheaper
//     than 10,000 index lookups (TestPlansHoldOnStaleStatistics shows that
//     plan being chosen without the settings below);
//   - a prepared statement switches to a generic plan after five runs,
//     planned without the array's length (measured up to 6 times slower);
//   - the stall rule's filters get default selectivities, so the planner
//     expects about one row where a batch has a thousand and joins the
//     batch's array (unnest) in a nested loop, once per row: EXPLAIN
//     ANALYZE measured 1.2 s for a batch of 1,000 against 21 ms by hash.
//
// So each such statement runs in a pipeline behind PinPlansSQL, which
// turns sequential scans and nested loops off and forces custom plans
// until the end of the transaction: the explicit one of a reap, or the implicit one a pipeline
// forms up to its Sync. Nothing is sent at connection start (poolers in
// transaction mode reject startup parameters and would leak a session
// setting to the next client), and the reap restores both settings before
// the operator's cascades run. Every such statement then reads jobs by the
// primary key and joins by hash; TestPlansHoldOnStaleStatistics checks it.

// PinPlansSQL saves the two settings (the subquery runs first) and sets them
// for the rest of the transaction. It returns the saved values.
const PinPlansSQL = `
SELECT saved.Seqscan, saved.Nestloop, saved.cache_mode,
       set_config('enable_seqscan', 'off', true), set_config('enable_nestloop', 'off', true),
       set_config('plan_cache_mode', 'force_custom_plan', true)
  FROM (SELECT current_setting('enable_seqscan') AS seqscan, current_setting('enable_nestloop') AS nestloop,
               current_setting('plan_cache_mode') AS cache_mode OFFSET 0) AS saved`

// RestorePlansSQL sets the two settings back to the values PinPlansSQL
// saved.
const RestorePlansSQL = `SELECT set_config('enable_seqscan', $1, true), set_config('enable_nestloop', $2, true),
       set_config('plan_cache_mode', $3, true)`

// SavedPlans holds the settings PinPlansSQL replaced.
type SavedPlans struct{ Seqscan, Nestloop, CacheMode string }

// BatchSender is what runs a pipeline: *pgxpool.Pool, *pgx.Conn and pgx.Tx.
type BatchSender interface {
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// Before is a statement PinnedQuery runs between the settings and its
// query, in the same pipeline.
type Before struct {
	SQL  string
	Args []any
}

// PinnedQuery runs sql with args behind PinPlansSQL in one pipeline (one
// round trip), after the statements of pre if any, and returns its rows and
// the saved settings. The caller closes rows; when db is not a
// transaction, the settings end with the pipeline.
func PinnedQuery(ctx context.Context, db BatchSender, sql string, args any, pre ...Before) (pgx.Rows, SavedPlans, error) {
	b := &pgx.Batch{}
	b.Queue(PinPlansSQL)
	for _, st := range pre {
		b.Queue(st.SQL, st.Args...)
	}
	b.Queue(sql, args)
	br := db.SendBatch(ctx, b)
	var saved SavedPlans
	var ignore [3]string
	if err := br.QueryRow().Scan(&saved.Seqscan, &saved.Nestloop, &saved.CacheMode, &ignore[0], &ignore[1], &ignore[2]); err != nil {
		_ = br.Close()
		return nil, saved, err
	}
	for range pre {
		if _, err := br.Exec(); err != nil {
			_ = br.Close()
			return nil, saved, err
		}
	}
	rows, err := br.Query()
	if err != nil {
		_ = br.Close()
		return nil, saved, err
	}
	return &batchRows{Rows: rows, br: br}, saved, nil
}

// batchRows closes its pipeline with its rows.
type batchRows struct {
	pgx.Rows
	br pgx.BatchResults
}

func (r *batchRows) Close() {
	r.Rows.Close()
	_ = r.br.Close()
}

// PinnedExec runs sql with args behind PinPlansSQL in one pipeline.
func PinnedExec(ctx context.Context, db BatchSender, sql string, args ...any) error {
	b := &pgx.Batch{}
	b.Queue(PinPlansSQL)
	b.Queue(sql, args...)
	return db.SendBatch(ctx, b).Close()
}
