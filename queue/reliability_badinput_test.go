package queue

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/hibiken/asynq"

	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
)

// oddIDs are job IDs a product may really use: quotes, braces, spaces,
// SQL and format syntax, non-ASCII, exactly jobs.MaxIDLength bytes.
var oddIDs = []string{`it's "quoted"`, "{braces}", "with spaces", "rapport-été-日本", "'; DROP TABLE jobs; --",
	"%s%d\\n", strings.Repeat("k", jobs.MaxIDLength)}

// hugePayload is a task payload far above anything a job needs (16 MiB):
// the guard never reads a payload, so it decides on the ID alone.
var hugePayload = []byte(strings.Repeat("p", 16<<20))

// TestReliabilityBadInput_Guard delivers bad tasks through the start guard
// over real PostgreSQL and a miniredis: tasks without an ID, with IDs no
// row can have, odd IDs matching no row or a FAILED row, huge payloads,
// rows of an unknown type, and markers holding foreign values. Each gets
// the guard's documented answer (permanent or retryable), counted under
// its decision; the handler never runs and nothing is written.
func TestReliabilityBadInput_Guard(t *testing.T) {
	t.Parallel()
	tally := jobstest.NewBadInputs(t)
	type guardCase struct {
		name     string
		id       string
		payload  []byte
		setup    func(t *testing.T, b *guardBundle)
		want     error
		skip     bool // the error wraps asynq.SkipRetry: archived, no retry
		decision decision
	}
	var cases []guardCase
	cases = append(cases,
		guardCase{name: "NoTaskID", id: "", want: ErrNoTaskID, skip: true, decision: decisionNoTaskID},
		guardCase{name: "NulByte", id: "J\x00", want: jobs.ErrBadID, skip: true, decision: decisionBadJobID},
		guardCase{name: "InvalidUTF8", id: "J-\xff", want: jobs.ErrBadID, skip: true, decision: decisionBadJobID},
		guardCase{name: "OverTheLengthLimit", id: strings.Repeat("j", jobs.MaxIDLength+1), want: jobs.ErrBadID, skip: true, decision: decisionBadJobID},
		guardCase{name: "HugePayloadWithoutARow", id: "J-huge", payload: hugePayload, want: jobs.ErrNotFound, decision: decisionNoRow},
		guardCase{name: "HugePayloadOfAFailedJob", id: "J-huge-failed", payload: hugePayload, want: ErrJobFailed, skip: true, decision: decisionRefusedFailed,
			setup: func(t *testing.T, b *guardBundle) {
				b.db.Insert(t, jobstest.Job{ID: "J-huge-failed", Type: "report.export", Status: jobs.StatusQueued, Queue: "q"})
				failRow(t, b.db, "J-huge-failed", "boom")
			}},
	)
	for _, id := range oddIDs {
		cases = append(cases,
			guardCase{name: "OddIDWithoutARow/" + id, id: id, want: jobs.ErrNotFound, decision: decisionNoRow},
			guardCase{name: "OddIDOfAReapedJob/" + id, id: id, want: ErrJobReaped, skip: true, decision: decisionRefusedReaped,
				setup: func(t *testing.T, b *guardBundle) {
					b.db.Insert(t, jobstest.Job{ID: id, Type: "report.export", Status: jobs.StatusQueued, Queue: "q"})
					failRow(t, b.db, id, jobs.ReasonStalled)
				}})
	}
	for name, value := range map[string]string{"Word": "yes", "Hex": "0x10", "Float": "5.0", "Spaces": " 5 ", "Negative": "-1", "Huge": "99999999999999999999"} {
		cases = append(cases, guardCase{name: "MarkerHolding" + name, id: "J-marker", want: ErrBadMarker, decision: decisionBadMarker,
			setup: func(t *testing.T, b *guardBundle) {
				b.db.Insert(t, jobstest.Job{ID: "J-marker", Type: "report.export", Status: jobs.StatusQueued, Queue: "q"})
				b.mr.Set(MarkerKey("J-marker"), value)
			}})
	}
	cases = append(cases, guardCase{name: "MarkerThatIsAHash", id: "J-hash", want: ErrBadMarker, decision: decisionBadMarker,
		setup: func(t *testing.T, b *guardBundle) {
			b.db.Insert(t, jobstest.Job{ID: "J-hash", Type: "report.export", Status: jobs.StatusQueued, Queue: "q"})
			b.mr.HSet(MarkerKey("J-hash"), "generation", "1")
		}})

	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tally.Try(t)
			b := setupGuard(t)
			if tc.setup != nil {
				tc.setup(t, b)
			}
			before := guardState(t, b)
			g := b.guard(t, "W1", nil, nil)
			h := &recorder{}
			err := g.Middleware()(h).ProcessTask(context.WithValue(t.Context(), testTaskIDKey{}, tc.id), asynq.NewTask("report.export", tc.payload))
			if !errors.Is(err, tc.want) || errors.Is(err, asynq.SkipRetry) != tc.skip || !IsFailure(err) {
				t.Fatalf("guard returned %v; want %v, SkipRetry %v, counted as a failure", err, tc.want, tc.skip)
			}
			if tc.id != "" && jobs.CheckID(tc.id) == nil && !strings.Contains(err.Error(), tc.id) {
				t.Fatalf("error %q does not name the job", err)
			}
			if n := h.runs(); n != 0 {
				t.Fatalf("handler ran %d times", n)
			}
			if got := b.decisions(decisionNames[tc.decision]); got != 1 {
				t.Fatalf("decision %s counted %v times, want 1", decisionNames[tc.decision], got)
			}
			if after := guardState(t, b); after != before {
				t.Fatalf("something was written:\nbefore %s\nafter  %s", before, after)
			}
		})
	}
}

// guardState is every row, event and Redis key of the bundle, as text.
func guardState(t *testing.T, b *guardBundle) string {
	t.Helper()
	var rows string
	if err := b.db.Pool.QueryRow(context.Background(), `SELECT coalesce(string_agg(row(j.*)::text, ';' ORDER BY id), '') || '|' ||
  (SELECT count(*) FROM `+b.db.Table("job_events")+`) FROM `+b.db.Table("jobs")+` j`).Scan(&rows); err != nil {
		t.Fatal(err)
	}
	return rows + "|" + b.mr.Dump()
}

// TestReliabilityBadInput_Enqueue: the enqueue helper refuses, before
// anything reaches Redis, tasks it must not send: an empty ID, IDs no row
// can have, IDs matching no row, a type other than the row's (with a huge
// payload too), a row of an unknown type, a nil task. Each error names
// what is wrong; the queue stays empty and the rows are unchanged.
func TestReliabilityBadInput_Enqueue(t *testing.T) {
	t.Parallel()
	tally := jobstest.NewBadInputs(t)
	rc := realRedis(t)
	queue := unique(t, "badinput-")
	deleteQueueAtCleanup(t, rc, queue)
	b := setupEnqueue(t, rc)
	b.db.Insert(t, jobstest.Job{ID: "J-row", Type: "report.export", Status: jobs.StatusQueued, Queue: queue})
	b.db.Insert(t, jobstest.Job{ID: "J-unknown-type", Type: "no.such.type", Status: jobs.StatusQueued, Queue: queue})
	for _, id := range oddIDs {
		b.db.Insert(t, jobstest.Job{ID: id, Type: "report.export", Status: jobs.StatusCompleted, Queue: queue})
	}
	type enqueueCase struct {
		name     string
		task     *asynq.Task
		id       string
		want     error
		fragment string
	}
	report := asynq.NewTask("report.export", []byte(`{"report":1}`))
	cases := []enqueueCase{
		{"EmptyID", report, "", jobs.ErrBadID, "job ID is empty"},
		{"NulByte", report, "J\x00", jobs.ErrBadID, `"J\x00" contains a NUL byte`},
		{"InvalidUTF8", report, "J-\xff", jobs.ErrBadID, "is not valid UTF-8"},
		{"OverTheLengthLimit", report, strings.Repeat("j", jobs.MaxIDLength+1), jobs.ErrBadID, "over the limit of 1024"},
		{"IDMatchingNoRow", report, "ghost", jobs.ErrNotFound, "ghost"},
		{"TypeOtherThanTheRows", asynq.NewTask("crawl.site", nil), "J-row", ErrTypeConflict, "crawl.site"},
		{"HugePayloadOfTheWrongType", asynq.NewTask("crawl.site", hugePayload), "J-row", ErrTypeConflict, "report.export"},
		{"RowOfAnUnknownType", asynq.NewTask("no.such.type", nil), "J-unknown-type", jobs.ErrUnknownType, "no.such.type"},
		{"NilTask", nil, "J-row", jobs.ErrInvalidArgument, "J-row"},
	}
	for _, id := range oddIDs {
		cases = append(cases, enqueueCase{"OddIDOfACompletedJob/" + id, report, id, jobs.ErrJobTerminal, ""})
	}
	before := b.db.Count(t, `SELECT count(*) FROM job_events`)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tally.Try(t)
			_, err := Enqueue(t.Context(), b.client, b.store, tc.task, tc.id)
			if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.fragment) {
				t.Fatalf("Enqueue = %v; want %v naming %q", err, tc.want, tc.fragment)
			}
		})
	}
	if known, err := rc.SIsMember(t.Context(), "asynq:queues", queue).Result(); err != nil || known {
		t.Fatalf("queue %s known to asynq: %v (%v); want nothing ever enqueued there", queue, known, err)
	}
	if n := b.db.Count(t, `SELECT count(*) FROM job_events`); n != before {
		t.Fatalf("job_events: %d rows, was %d", n, before)
	}
}
