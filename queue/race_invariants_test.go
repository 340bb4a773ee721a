package queue_test

import "fmt"

// raceWrites classifies every UPDATE of the interleaving's job rows
// (race_writes) by what it did. A claim or a requeue moves the generation
// up by one; every other write keeps it and is one of the fenced writes of
// an attempt (advanced, heartbeat, completed, failed, released), a reap,
// or the reaper's bookkeeping of a FAILED row's marker. Anything else is
// unexpected. x is the writing transaction as an xid, to be compared with
// the xmin of the rows written with it.
const raceWrites = `
WITH w AS (
  SELECT a.*, a.tx::xid AS x,
    CASE
      WHEN a.new_gen = a.old_gen + 1 AND a.new_first = a.old_first AND a.old_status IN ('QUEUED', 'PROCESSING')
           AND a.new_status = 'PROCESSING' AND a.new_cursor = a.old_cursor AND a.new_mark = 0 THEN 'claimed'
      WHEN a.new_gen = a.old_gen + 1 AND a.new_first = a.old_first AND a.old_status IN ('FAILED', 'QUEUED')
           AND a.new_status = 'QUEUED' AND a.new_cursor = a.old_cursor THEN 'requeued'
      WHEN a.new_gen <> a.old_gen OR a.new_first <> a.old_first OR a.new_total IS DISTINCT FROM a.old_total THEN 'unexpected'
      WHEN a.old_status = 'PROCESSING' AND a.new_status = 'PROCESSING' AND a.new_cursor > a.old_cursor
           AND a.new_mark = a.old_mark AND a.new_updated >= a.old_updated THEN 'advanced'
      WHEN a.old_status = 'PROCESSING' AND a.new_status = 'PROCESSING' AND a.new_mark > a.old_mark
           AND a.new_cursor = a.old_cursor AND a.new_updated >= a.old_updated THEN 'heartbeat'
      WHEN a.new_cursor <> a.old_cursor OR a.new_mark <> a.old_mark OR a.new_updated <> a.old_updated THEN 'unexpected'
      WHEN a.old_status = 'PROCESSING' AND a.new_status = 'COMPLETED' THEN 'completed'
      WHEN a.old_status = 'PROCESSING' AND a.new_status = 'FAILED' AND a.new_reason IN ('stalled', 'lost_task') THEN 'reaped'
      WHEN a.old_status = 'PROCESSING' AND a.new_status = 'FAILED' AND a.new_reason IS NOT NULL THEN 'failed'
      WHEN a.old_status = 'PROCESSING' AND a.new_status = 'QUEUED' THEN 'released'
      WHEN a.old_status = 'FAILED' AND a.new_status = 'FAILED' AND a.new_reason IS NOT DISTINCT FROM a.old_reason THEN 'bookkeeping'
      ELSE 'unexpected'
    END AS kind
    FROM race_writes a
   WHERE a.job_id = ANY($1) AND a.op = 'UPDATE')`

// raceCheck is one invariant in SQL: every row it returns is a violation,
// described by detail. lost marks the checks whose rows are rows lost.
type raceCheck struct {
	name, sql string
	lost      bool
}

var raceChecks = []raceCheck{
	// Generations: every write is one the product makes, tagged with the
	// generation of the attempt that made it, and only while that
	// generation is the job's.
	{name: "unexpected_write", sql: `SELECT format('%s write %s: generation %s->%s, %s->%s, cursor %s->%s, mark %s->%s, reason %s->%s',
  job_id, seq, old_gen, new_gen, old_status, new_status, old_cursor, new_cursor, old_mark, new_mark, old_reason, new_reason)
  FROM w WHERE kind = 'unexpected'`},
	{name: "stale_heartbeat_landed", sql: `SELECT format('%s generation %s took the mark %s of generation %s', job_id, new_gen, new_mark, new_mark / 1000)
  FROM w WHERE kind = 'heartbeat' AND new_mark / 1000 <> new_gen`},
	{name: "cursor_moved_without_a_batch_of_its_generation", sql: `SELECT format('%s generation %s cursor %s->%s', job_id, new_gen, old_cursor, new_cursor)
  FROM w WHERE kind = 'advanced' AND NOT EXISTS (
    SELECT FROM race_batches b WHERE b.tx = w.tx AND b.job_id = w.job_id AND b.generation = w.new_gen
       AND b.expected_cursor = w.old_cursor AND b.cursor_after = w.new_cursor)`},
	{name: "batch_recorded_without_its_cursor_move", sql: `SELECT format('%s token %s generation %s', job_id, token, generation)
  FROM race_batches b WHERE b.job_id = ANY($1) AND NOT EXISTS (
    SELECT FROM w WHERE w.tx = b.tx AND w.job_id = b.job_id AND w.kind = 'advanced' AND w.new_gen = b.generation)`},
	{name: "write_without_its_event", sql: `SELECT format('%s %s at generation %s (write %s)', job_id, kind, new_gen, seq)
  FROM w WHERE kind IN ('claimed', 'requeued', 'completed', 'failed', 'reaped', 'released')
   AND (SELECT count(*) FROM job_events e WHERE e.xmin = w.x AND e.job_id = w.job_id AND e.kind = w.kind
           AND e.generation = w.new_gen) <> 1`},
	{name: "event_without_its_write", sql: `SELECT format('%s %s event %s names generation %s', e.job_id, e.kind, e.id, e.generation)
  FROM job_events e WHERE e.job_id = ANY($1) AND e.kind IN ('claimed', 'requeued', 'completed', 'failed', 'reaped', 'released')
   AND NOT EXISTS (SELECT FROM w WHERE w.x = e.xmin AND w.job_id = e.job_id AND w.kind = e.kind AND w.new_gen = e.generation)`},
	{name: "terminal_transitions_of_one_generation", sql: `SELECT format('%s generation %s: %s', job_id, new_gen, string_agg(kind, ', '))
  FROM w WHERE kind IN ('completed', 'failed', 'reaped') GROUP BY job_id, new_gen HAVING count(*) > 1`},
	{name: "failure_code_of_another_generation", sql: `SELECT format('%s generation %s failed with %s', job_id, new_gen, new_reason)
  FROM w WHERE kind = 'failed' AND new_reason LIKE 'failed\_g%' AND new_reason <> 'failed_g' || new_gen`},
	{name: "terminal_write_without_its_cascade", sql: `SELECT format('%s %s at generation %s', job_id, kind, new_gen)
  FROM w WHERE kind IN ('completed', 'failed', 'reaped')
   AND (SELECT count(*) FROM race_cascades c WHERE c.xmin = w.x AND c.job_id = w.job_id AND c.generation = w.new_gen
           AND c.hook = CASE w.kind WHEN 'completed' THEN 'completed' ELSE 'failed' END) <> 1`},
	{name: "cascade_without_its_terminal_write", sql: `SELECT format('%s %s cascade at generation %s', c.job_id, c.hook, c.generation)
  FROM race_cascades c WHERE c.job_id = ANY($1) AND NOT EXISTS (
    SELECT FROM w WHERE w.x = c.xmin AND w.job_id = c.job_id AND w.new_gen = c.generation
       AND (c.hook = 'completed' AND w.kind = 'completed' OR c.hook = 'failed' AND w.kind IN ('failed', 'reaped')))`},
	{name: "cursor_backwards_or_past_total", sql: `SELECT format('%s write %s: cursor %s->%s of total %s', job_id, seq, old_cursor, new_cursor, new_total)
  FROM race_writes WHERE job_id = ANY($1) AND op = 'UPDATE' AND (new_cursor < old_cursor OR new_cursor > new_total)`},
	{name: "reaped_a_job_that_was_not_stalled", sql: `SELECT format('%s generation %s reaped at %s: started %s, idle since %s, stall timeout %s',
  job_id, new_gen, at, old_started, old_updated, $2::interval)
  FROM w WHERE kind = 'reaped'
   AND (new_reason <> 'stalled' OR old_started IS NULL OR at - old_started <= interval '1 microsecond' OR at - old_updated < $2::interval)`},
	// The retry budget: at most reap_retries retry reaps in a life, and
	// at most reap_retries + 1 reaps in a life since its last requeue
	// (a requeue keeps the count but may be reaped again).
	{name: "more_retry_reaps_than_the_budget", sql: `SELECT format('%s has %s retry reaps in this life, reap_retries %s', j.id, n, t.reap_retries)
  FROM jobs j JOIN job_types t ON t.name = j.type
       CROSS JOIN LATERAL (SELECT count(*) AS n FROM job_events e WHERE e.job_id = j.id AND e.kind = 'reaped'
                              AND e.generation >= j.first_generation AND e.detail->>'retry' = 'true') e
 WHERE j.id = ANY($1) AND n > t.reap_retries`},
	{name: "more_reaps_per_life_than_the_budget_allows", sql: `SELECT format('%s has %s reaps in this life since its last requeue, reap_retries %s', j.id, n, t.reap_retries)
  FROM jobs j JOIN job_types t ON t.name = j.type
       CROSS JOIN LATERAL (SELECT count(*) AS n FROM job_events e WHERE e.job_id = j.id AND e.kind = 'reaped'
                              AND e.generation >= greatest(j.first_generation,
                                    (SELECT max(r.generation) FROM job_events r WHERE r.job_id = j.id AND r.kind = 'requeued'))) e
 WHERE j.id = ANY($1) AND n > t.reap_retries + 1`},
	{name: "reaped_events_of_one_generation", sql: `SELECT format('%s generation %s has %s reaped events', job_id, generation, count(*))
  FROM job_events WHERE job_id = ANY($1) AND kind = 'reaped' GROUP BY job_id, generation HAVING count(*) <> 1`},

	// The job rows after a clean pass: none lost, none left PROCESSING.
	{name: "job_row_lost", lost: true, sql: `SELECT u.id FROM unnest($1::text[]) AS u(id) WHERE NOT EXISTS (SELECT FROM jobs j WHERE j.id = u.id)`},
	{name: "left_processing_after_a_clean_pass", lost: true, sql: `SELECT format('%s generation %s', id, generation)
  FROM jobs WHERE id = ANY($1) AND status = 'PROCESSING'`},

	// Batches of the current life: the cursor is their sum, and a
	// batch's items exist, written by its generation in its transaction,
	// if and only if its token is recorded.
	{name: "cursor_is_not_the_batches_of_its_life", sql: `SELECT format('%s cursor %s, batches of this life %s', j.id, j."cursor", b.n)
  FROM jobs j CROSS JOIN LATERAL (SELECT coalesce(sum(count), 0) AS n FROM job_batches b
                                   WHERE b.job_id = j.id AND b.generation >= j.first_generation) b
 WHERE j.id = ANY($1) AND j."cursor" <> b.n`},
	{name: "recorded_batch_without_its_items", lost: true, sql: `SELECT format('%s token %s item %s', j.id, b.token, n)
  FROM jobs j JOIN job_batches b ON b.job_id = j.id AND b.generation >= j.first_generation
       CROSS JOIN LATERAL generate_series(b.expected_cursor + 1, b.cursor_after) AS n
 WHERE j.id = ANY($1)
   AND (SELECT count(*) FROM items i WHERE i.job_id = j.id AND i.n = n AND i.generation = b.generation AND i.xmin = b.xmin) <> 1`},
	{name: "items_without_a_recorded_batch", sql: `SELECT format('%s item %s of generation %s', i.job_id, i.n, i.generation)
  FROM items i JOIN jobs j ON j.id = i.job_id
 WHERE i.job_id = ANY($1) AND NOT EXISTS (
    SELECT FROM job_batches b WHERE b.job_id = i.job_id AND b.generation >= j.first_generation
       AND b.generation = i.generation AND i.n > b.expected_cursor AND i.n <= b.cursor_after)`},

	// Course: COMPLETED if and only if its chapter (with its lesson and
	// lecture) exists, written in the transaction of this life's
	// completion; the course counts its chapters.
	{name: "course_completed_without_its_chapter", lost: true, sql: `SELECT j.id FROM jobs j
 WHERE j.id = ANY($1) AND j.type = 'report.export' AND j.status = 'COMPLETED'
   AND (SELECT count(*) FROM chapters c JOIN lessons l ON l.chapter_id = c.id JOIN lectures x ON x.lesson_id = l.id
         WHERE c.job_id = j.id) <> 1`},
	{name: "course_chapter_without_its_completion", sql: `SELECT format('%s is %s with chapter %s', j.id, j.status, c.id)
  FROM chapters c JOIN jobs j ON j.id = c.job_id
 WHERE c.job_id = ANY($1) AND NOT EXISTS (
    SELECT FROM w WHERE w.job_id = j.id AND w.kind = 'completed' AND w.new_gen = j.generation AND w.x = c.xmin)`},
	{name: "course_count_is_not_its_chapters", sql: `SELECT format('course %s counts %s chapters', co.id, co.chapter_count)
  FROM courses co JOIN jobs j ON j.parent_id = co.id
 WHERE j.id = ANY($1) AND co.chapter_count <> (SELECT count(*) FROM chapters c WHERE c.course_id = co.id)`},

	// Video: charged at most once, and only COMPLETED with all its
	// metadata; a video whose job did not complete is untouched.
	{name: "video_charged_more_than_once", sql: `SELECT format('%s charged %s times', job_id, count(*))
  FROM usage WHERE job_id = ANY($1) GROUP BY job_id HAVING count(*) > 1`},
	{name: "video_charged_without_completion_and_metadata", sql: `SELECT format('%s is %s, video %s title %s duration %s thumbnail %s', j.id, j.status, v.status, v.title, v.duration_s, v.thumbnail)
  FROM usage u JOIN jobs j ON j.id = u.job_id JOIN videos v ON v.id = j.parent_id
 WHERE u.job_id = ANY($1)
   AND (j.status <> 'COMPLETED' OR v.status <> 'READY' OR v.title IS NULL OR v.duration_s IS NULL OR v.thumbnail IS NULL)`},
	{name: "video_touched_without_completion", sql: `SELECT format('%s is %s, video %s title %s duration %s', j.id, j.status, v.status, v.title, v.duration_s)
  FROM jobs j JOIN videos v ON v.id = j.parent_id
 WHERE j.id = ANY($1) AND j.status <> 'COMPLETED'
   AND (v.status <> 'RENDERING' OR v.title IS NOT NULL OR v.duration_s IS NOT NULL OR v.thumbnail IS NOT NULL)`},
	{name: "video_completed_not_ready", lost: true, sql: `SELECT j.id FROM jobs j JOIN videos v ON v.id = j.parent_id
 WHERE j.id = ANY($1) AND j.status = 'COMPLETED' AND v.status <> 'READY'`},
}

// raceCheckSQL is every raceCheck in one statement (one round trip per
// interleaving).
var raceCheckSQL = func() string {
	q := raceWrites
	for i, c := range raceChecks {
		if i > 0 {
			q += "\nUNION ALL"
		}
		q += fmt.Sprintf("\nSELECT %d, detail::text FROM (%s) AS c%d(detail)", i, c.sql, i)
	}
	return q
}()
