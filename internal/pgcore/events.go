package pgcore

import (
	"context"

	"github.com/jackc/pgx/v5"
)

// appendEventSQL appends one job_events row; a NULL detail is stored as
// an empty object.
const appendEventSQL = `
INSERT INTO {schema}.job_events (job_id, kind, generation, worker, detail)
VALUES ($1, $2, $3, nullif($4, ''), coalesce($5::jsonb, '{}'))`

// AppendEvent writes an event of kind for jobID at generation in tx, the
// transaction that changed the job, so that the event commits with the
// change or not at all. worker "" and a nil detail (a JSON object when
// given) are stored as NULL and {}.
func (c *Core) AppendEvent(ctx context.Context, tx pgx.Tx, jobID, kind string, generation int64, worker string, detail []byte) error {
	var d any
	if detail != nil {
		d = JSONText(detail)
	}
	_, err := tx.Exec(ctx, c.Q(appendEventSQL), jobID, kind, generation, worker, d)
	return err
}

// JSONText passes a JSON document as text. A []byte argument would be sent
// as bytea under default_query_exec_mode=exec (the mode pooled URLs use,
// which infers types from Go values), and PostgreSQL would refuse it as
// jsonb.
func JSONText(doc []byte) string { return string(doc) }
