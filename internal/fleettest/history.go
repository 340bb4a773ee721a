package fleettest

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// historySQL installs the test-only history on a schema: two tables and
// two triggers that log every change of a job's updated_at, generation or
// status, and every version of a leader lease row, with the database time
// of the writing transaction's COMMIT: the triggers are deferred to it
// (DEFERRABLE INITIALLY DEFERRED), so clock_timestamp() is read as the
// transaction commits, not when its statement ran. A reap that stood
// still between its UPDATE and its COMMIT is logged at the COMMIT, which
// is when it took effect, and rows are numbered (seq) in commit order. A test installs it on its own schema; no migration creates
// it, and no release build knows it.
const historySQL = `
CREATE TABLE {schema}.fleet_history (
    seq bigserial PRIMARY KEY,
    at timestamptz NOT NULL DEFAULT clock_timestamp(),
    job_id text NOT NULL,
    generation bigint NOT NULL,
    status text NOT NULL,
    updated_at timestamptz,
    worker text,
    failure_reason text
);
CREATE TABLE {schema}.fleet_lease_history (
    seq bigserial PRIMARY KEY,
    at timestamptz NOT NULL DEFAULT clock_timestamp(),
    key text NOT NULL,
    holder_id text,
    expires_at timestamptz
);
CREATE TABLE {schema}.fleet_charges (
    job_id text NOT NULL,
    generation bigint NOT NULL,
    at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE FUNCTION {schema}.fleet_log_job() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' OR NEW.updated_at IS DISTINCT FROM OLD.updated_at
       OR NEW.generation IS DISTINCT FROM OLD.generation OR NEW.status IS DISTINCT FROM OLD.status THEN
        INSERT INTO {schema}.fleet_history (job_id, generation, status, updated_at, worker, failure_reason)
        VALUES (NEW.id, NEW.generation, NEW.status, NEW.updated_at, NEW.worker, NEW.failure_reason);
    END IF;
    RETURN NULL;
END $$;
CREATE CONSTRAINT TRIGGER fleet_log_job AFTER INSERT OR UPDATE ON {schema}.jobs
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION {schema}.fleet_log_job();
CREATE FUNCTION {schema}.fleet_log_lease() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        INSERT INTO {schema}.fleet_lease_history (key, holder_id, expires_at) VALUES (OLD.key, NULL, NULL);
        RETURN NULL;
    END IF;
    INSERT INTO {schema}.fleet_lease_history (key, holder_id, expires_at) VALUES (NEW.key, NEW.holder_id, NEW.expires_at);
    RETURN NULL;
END $$;
CREATE CONSTRAINT TRIGGER fleet_log_lease AFTER INSERT OR UPDATE OR DELETE ON {schema}.leader_leases
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION {schema}.fleet_log_lease();
`

// InstallHistory creates the history tables and triggers of historySQL
// on schema (migrated already), and fleet_charges, the table the worker
// program's --charges fleet_charges writes. It fails t on any error.
func InstallHistory(t testing.TB, pool *pgxpool.Pool, schema string) {
	t.Helper()
	sql := strings.ReplaceAll(historySQL, "{schema}", pgx.Identifier{schema}.Sanitize())
	if _, err := pool.Exec(context.Background(), sql); err != nil {
		t.Fatalf("installing the fleet history on %s: %v", schema, err)
	}
}

// ReadHistory reads what the history recorded on schema, and the reaped
// events and charges, into h (its Transitions, Reaps, Leases and
// Charges; the rest is the test's to fill).
func ReadHistory(t testing.TB, pool *pgxpool.Pool, schema string, h *History) {
	t.Helper()
	ctx := context.Background()
	s := pgx.Identifier{schema}.Sanitize()
	rows, err := pool.Query(ctx, `SELECT at, job_id, generation, status, updated_at, coalesce(worker, ''), coalesce(failure_reason, '')
 FROM `+s+`.fleet_history ORDER BY seq`)
	if err != nil {
		t.Fatal(err)
	}
	h.Transitions, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (Transition, error) {
		var x Transition
		var upd *time.Time
		err := r.Scan(&x.At, &x.JobID, &x.Generation, &x.Status, &upd, &x.Worker, &x.FailureReason)
		if upd != nil {
			x.UpdatedAt = *upd
		}
		return x, err
	})
	if err != nil {
		t.Fatal(err)
	}
	rows, err = pool.Query(ctx, `SELECT job_id, generation, (detail->>'db_now')::timestamptz, coalesce(detail->>'holder_id', ''),
       coalesce((detail->>'retry')::bool, false), (detail->>'updated_at')::timestamptz,
       (detail->>'stall_timeout_seconds')::float8, (detail->>'outage_end')::timestamptz
 FROM `+s+`.job_events WHERE kind = 'reaped' ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	h.Reaps, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (ReapEvent, error) {
		var x ReapEvent
		var stall float64
		var end *time.Time
		err := r.Scan(&x.JobID, &x.Generation, &x.DBNow, &x.HolderID, &x.Retry, &x.UpdatedAt, &stall, &end)
		x.StallTimeout = time.Duration(stall * float64(time.Second))
		if end != nil {
			x.OutageEnd = *end
		}
		return x, err
	})
	if err != nil {
		t.Fatal(err)
	}
	rows, err = pool.Query(ctx, `SELECT at, key, coalesce(holder_id, ''), coalesce(expires_at, 'epoch') FROM `+s+`.fleet_lease_history ORDER BY seq`)
	if err != nil {
		t.Fatal(err)
	}
	h.Leases, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (LeaseVersion, error) {
		var x LeaseVersion
		err := r.Scan(&x.At, &x.Key, &x.HolderID, &x.ExpiresAt)
		return x, err
	})
	if err != nil {
		t.Fatal(err)
	}
	rows, err = pool.Query(ctx, `SELECT job_id, generation FROM `+s+`.fleet_charges ORDER BY at`)
	if err != nil {
		t.Fatal(err)
	}
	h.Charges, err = pgx.CollectRows(rows, pgx.RowToStructByPos[Charge])
	if err != nil {
		t.Fatal(err)
	}
}
