package soak

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
	"github.com/jobreaper/jobreaper/queue"
)

// soakNotesMax bounds the violations soakResult describes one by one; the
// count goes on.
const soakNotesMax = 20

// soakResult is what the check of every job found.
type soakResult struct {
	enqueued, completed, reaped, failedByHandler int
	// violations counts the jobs that broke an invariant (each once, with
	// its first broken rule), the handlers' anomalies (soak_anomalies) and
	// the reaps later than the bound; lost counts the jobs that did not
	// end (or have no row).
	violations, lost int
	notes            []string
}

func (r *soakResult) note(s string) {
	if len(r.notes) < soakNotesMax {
		r.notes = append(r.notes, s)
	} else if len(r.notes) == soakNotesMax {
		r.notes = append(r.notes, "... (more violations not described)")
	}
}

// soakRow is one job and what the soak's tables and jobreaper's events
// hold about it.
type soakRow struct {
	id, typ, status, reason                     string
	generation, firstGeneration, cursor, total  int64
	updatedAt                                   time.Time
	items, distinctItems, results, charges      int64
	completions, failures                       int64
	completedEvents, reapedEvents, lateRejected int64
	reapedDetail                                []byte
	reapedGeneration                            *int64
}

// soakRowsSQL reads every job with its counts, in ID order. Unqualified
// names are the soak's tables, in the test's schema (the pool's
// search_path).
const soakRowsSQL = `
SELECT j.id, j.type, j.status, coalesce(j.failure_reason, ''), j.generation, j.first_generation, j."cursor",
       coalesce(j.total, -1), j.updated_at,
       (SELECT count(*) FROM soak_items i WHERE i.job_id = j.id),
       (SELECT count(DISTINCT n) FROM soak_items i WHERE i.job_id = j.id),
       (SELECT count(*) FROM soak_results r WHERE r.job_id = j.id),
       (SELECT count(*) FROM soak_charges c WHERE c.job_id = j.id),
       (SELECT count(*) FROM soak_completions c WHERE c.job_id = j.id),
       (SELECT count(*) FROM soak_failures f WHERE f.job_id = j.id),
       (SELECT count(*) FROM {events} e WHERE e.job_id = j.id AND e.kind = 'completed'),
       (SELECT count(*) FROM {events} e WHERE e.job_id = j.id AND e.kind = 'reaped'),
       (SELECT count(*) FROM {events} e WHERE e.job_id = j.id AND e.kind = 'late_result_rejected'),
       (SELECT e.detail::text FROM {events} e WHERE e.job_id = j.id AND e.kind = 'reaped' ORDER BY e.id LIMIT 1),
       (SELECT e.generation FROM {events} e WHERE e.job_id = j.id AND e.kind = 'reaped' ORDER BY e.id LIMIT 1)
  FROM {jobs} j ORDER BY j.id`

// soakCheck checks every job of the soak against what its kind must end
// as, streaming the rows (constant memory however long the soak ran), and
// the handlers' anomalies.
func soakCheck(t *testing.T, db *jobstest.DB, rdb *redis.Client) soakResult {
	t.Helper()
	ctx := context.Background()
	markers, err := queue.NewMarkerStore(rdb)
	if err != nil {
		t.Fatal(err)
	}
	sql := strings.NewReplacer("{events}", db.Table("job_events"), "{jobs}", db.Table("jobs")).Replace(soakRowsSQL)
	rows, err := db.Pool.Query(ctx, sql)
	if err != nil {
		t.Fatalf("reading the soak's jobs: %v", err)
	}
	var res soakResult
	var r soakRow
	var detail *string
	_, err = pgx.ForEachRow(rows, []any{&r.id, &r.typ, &r.status, &r.reason, &r.generation, &r.firstGeneration, &r.cursor,
		&r.total, &r.updatedAt, &r.items, &r.distinctItems, &r.results, &r.charges, &r.completions, &r.failures,
		&r.completedEvents, &r.reapedEvents, &r.lateRejected, &detail, &r.reapedGeneration}, func() error {
		r.reapedDetail = nil
		if detail != nil {
			r.reapedDetail = []byte(*detail)
		}
		res.enqueued++
		switch {
		case r.status != jobs.StatusCompleted && r.status != jobs.StatusFailed:
			res.lost++
			res.note(fmt.Sprintf("job %s did not end: %s at generation %d", r.id, r.status, r.generation))
			return nil
		case r.status == jobs.StatusCompleted:
			res.completed++
		case r.reason == jobs.ReasonStalled || r.reason == jobs.ReasonLostTask:
			res.reaped++
		default:
			res.failedByHandler++
		}
		if broken := soakBroken(ctx, r, markers); broken != "" {
			res.violations++
			res.note(fmt.Sprintf("job %s (%s, %s %s, generation %d): %s", r.id, r.typ, r.status, r.reason, r.generation, broken))
		}
		return nil
	})
	if err != nil {
		t.Fatalf("reading the soak's jobs: %v", err)
	}

	anomalies, err := db.Pool.Query(ctx, `SELECT job_id, generation, what FROM soak_anomalies ORDER BY at`)
	if err != nil {
		t.Fatalf("reading the handlers' anomalies: %v", err)
	}
	var id, what string
	var gen int64
	_, err = pgx.ForEachRow(anomalies, []any{&id, &gen, &what}, func() error {
		res.violations++
		res.note(fmt.Sprintf("job %s generation %d, seen by its handler: %s", id, gen, what))
		return nil
	})
	if err != nil {
		t.Fatalf("reading the handlers' anomalies: %v", err)
	}
	return res
}

// soakBroken returns the first rule r breaks, or "". Every job: its product
// rows are exactly its committed batches (one per item, as many as the
// cursor, which never passes the total); at most one completion, charge,
// result, completed event and failure cascade. A COMPLETED job has all of
// its completion and no failure; a FAILED one, one failure cascade and
// nothing of a completion. Per kind: normal and flaky jobs complete (a
// flaky one after a retry), never reaped; doomed jobs fail with their
// handler's code, never reaped; stall and late jobs are reaped as stalled
// with exactly one reaped event of the row's generation and the marker of
// that generation, and no late write moved their row after the reap (the
// row's updated_at is the one the reap saw); late jobs' late writes were
// refused (their late_result_rejected events).
func soakBroken(ctx context.Context, r soakRow, markers *queue.MarkerStore) string {
	switch {
	case r.items != r.cursor || r.distinctItems != r.items:
		return fmt.Sprintf("%d product rows (%d distinct) for cursor %d", r.items, r.distinctItems, r.cursor)
	case r.total >= 0 && r.cursor > r.total:
		return fmt.Sprintf("cursor %d past total %d", r.cursor, r.total)
	case r.results > 1 || r.charges > 1 || r.completions > 1 || r.completedEvents > 1 || r.failures > 1:
		return fmt.Sprintf("%d results, %d charges, %d completion cascades, %d completed events, %d failure cascades: something ran twice",
			r.results, r.charges, r.completions, r.completedEvents, r.failures)
	case r.status == jobs.StatusCompleted && (r.results != 1 || r.charges != 1 || r.completions != 1 || r.completedEvents != 1 || r.failures != 0 || r.reapedEvents != 0):
		return fmt.Sprintf("COMPLETED with %d results, %d charges, %d completion cascades, %d completed events, %d failure cascades, %d reaped events",
			r.results, r.charges, r.completions, r.completedEvents, r.failures, r.reapedEvents)
	case r.status == jobs.StatusCompleted && r.cursor != r.total:
		return fmt.Sprintf("COMPLETED at cursor %d of %d", r.cursor, r.total)
	case r.status == jobs.StatusFailed && (r.results != 0 || r.charges != 0 || r.completions != 0 || r.completedEvents != 0 || r.failures != 1):
		return fmt.Sprintf("FAILED with %d results, %d charges, %d completion cascades, %d completed events, %d failure cascades",
			r.results, r.charges, r.completions, r.completedEvents, r.failures)
	}
	kind := strings.TrimPrefix(r.typ, "soak.")
	switch kind {
	case "normal", "flaky":
		if r.status != jobs.StatusCompleted {
			return "a job that progressed did not complete"
		}
		if kind == "flaky" && r.generation < r.firstGeneration+2 {
			return "completed without the retry its first attempt's failure asks for"
		}
		return ""
	case "doomed":
		if r.status != jobs.StatusFailed || r.reason != "soak_doomed" || r.reapedEvents != 0 {
			return fmt.Sprintf("want FAILED soak_doomed by its handler, %d reaped events", r.reapedEvents)
		}
		return ""
	case "stall", "late":
	default:
		return "a type the soak does not enqueue"
	}
	if r.status != jobs.StatusFailed || r.reason != jobs.ReasonStalled {
		return "a hung job was not reaped as stalled"
	}
	if r.reapedEvents != 1 || r.reapedGeneration == nil || *r.reapedGeneration != r.generation {
		return fmt.Sprintf("%d reaped events (first of generation %v), want exactly one of the row's generation", r.reapedEvents, r.reapedGeneration)
	}
	var ev struct {
		UpdatedAt time.Time `json:"updated_at"`
	}
	if err := json.Unmarshal(r.reapedDetail, &ev); err != nil {
		return fmt.Sprintf("reaped event detail %s: %v", r.reapedDetail, err)
	}
	if !ev.UpdatedAt.Equal(r.updatedAt) {
		return fmt.Sprintf("updated_at %s moved after the reap, which saw %s: a late write landed", r.updatedAt, ev.UpdatedAt)
	}
	if kind == "late" && r.lateRejected < 2 {
		return fmt.Sprintf("%d late_result_rejected events, want its late batch and completion refused", r.lateRejected)
	}
	gen, found, err := markers.Get(ctx, r.id)
	switch {
	case err != nil:
		return fmt.Sprintf("reading its marker: %v", err)
	case !found || gen != r.generation:
		return fmt.Sprintf("marker found=%v generation %d, want generation %d", found, gen, r.generation)
	}
	return ""
}

// soakDelays are the reap delays of the soak's reaped jobs, in ms.
type soakDelays struct {
	n, p50MS, p99MS, maxMS, overBound int
}

// soakReapDelays computes, on the database clock, each reaped job's delay
// from its last evidence of progress (updated_at) to its FAILED time
// (finished_at), the p50, p99 and largest, and how many exceed bound.
func soakReapDelays(t *testing.T, db *jobstest.DB, bound time.Duration) soakDelays {
	t.Helper()
	var d soakDelays
	err := db.Pool.QueryRow(context.Background(), `
SELECT count(*), coalesce(round(percentile_disc(0.5) WITHIN GROUP (ORDER BY ms)), 0)::int8,
       coalesce(round(percentile_disc(0.99) WITHIN GROUP (ORDER BY ms)), 0)::int8, coalesce(round(max(ms)), 0)::int8,
       count(*) FILTER (WHERE ms > $1::float8)
  FROM (SELECT extract(epoch FROM finished_at - updated_at) * 1000 AS ms
          FROM `+db.Table("jobs")+` WHERE status = 'FAILED' AND failure_reason IN ('stalled', 'lost_task')) AS d`,
		float64(bound.Microseconds())/1000).Scan(&d.n, &d.p50MS, &d.p99MS, &d.maxMS, &d.overBound)
	if err != nil {
		t.Fatalf("reading the reap delays: %v", err)
	}
	return d
}
