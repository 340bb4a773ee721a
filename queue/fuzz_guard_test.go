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

// FuzzGuardTaskData delivers a task with any ID, type and payload through
// the start guard over the real PostgreSQL (one schema) and a miniredis,
// with or without a row of that ID in any status and with any value under
// its marker key. The handler runs exactly when the row is QUEUED or
// PROCESSING and no readable marker refuses it; otherwise the guard
// answers as its contract says (no task ID, bad job ID, no row, completed,
// failed, bad marker, reaped) and writes nothing: the row, its events and
// the marker are as before. The task's type and payload never change the
// decision (the guard reads neither).
func FuzzGuardTaskData(f *testing.F) {
	for _, id := range []string{"J1", "", "J\x00", "\xff", strings.Repeat("a", jobs.MaxIDLength), strings.Repeat("a", jobs.MaxIDLength+1),
		`it's "quoted"`, "{braces}", "with spaces", "rapport-été-日本", "%s%d", "'; DROP TABLE jobs; --"} {
		for _, row := range []uint8{0, 1, 2, 3, 4} {
			f.Add(id, "report.export", []byte(nil), row, "")
		}
	}
	f.Add("J2", "", []byte{0, 1, 2}, uint8(1), "1")
	f.Add("J2", "other.type", []byte(`{"x":1}`), uint8(2), "0")
	f.Add("J2", "report.export", []byte(nil), uint8(1), "yes")
	f.Add("J2", "report.export", []byte(nil), uint8(1|8), "")
	f.Add("J2", "report.export", []byte(nil), uint8(2), "99")

	b := setupGuard(f)
	f.Fuzz(func(t *testing.T, id, typ string, payload []byte, row uint8, marker string) {
		checkGuardTaskData(t, b, id, typ, payload, row, marker)
	})
}

func checkGuardTaskData(t *testing.T, b *guardBundle, id, typ string, payload []byte, row uint8, marker string) {
	t.Helper()
	ctx := context.Background()
	status := [...]string{"", jobs.StatusQueued, jobs.StatusProcessing, jobs.StatusCompleted, jobs.StatusFailed}[row&7%5]
	jobType := "report.export"
	if row&8 != 0 {
		jobType = "no.such.type"
	}
	storable := jobs.CheckID(id) == nil
	if storable {
		defer func() {
			for _, table := range []string{"jobs", "job_events", "job_batches", "job_past_lives"} {
				col := "job_id"
				if table == "jobs" {
					col = "id"
				}
				if _, err := b.db.Pool.Exec(ctx, `DELETE FROM `+b.db.Table(table)+` WHERE `+col+` = $1`, id); err != nil {
					t.Errorf("cleaning up %s: %v", table, err)
				}
			}
		}()
	}
	if marker != "" {
		b.mr.Set(MarkerKey(id), marker)
		defer b.mr.Del(MarkerKey(id))
	}
	if status != "" && storable {
		b.db.Insert(t, jobstest.Job{ID: id, Type: jobType, Status: status, Generation: 1, Queue: "fuzz",
			StartedAgo: jobstest.Ago(0), IdleAgo: 0})
	}
	type state struct {
		row          string
		events, rows int64
		marker       string
	}
	read := func() state {
		var s state
		if storable {
			if err := b.db.Pool.QueryRow(ctx, `SELECT coalesce((SELECT format('%s/%s/%s', status, generation, coalesce(failure_reason, ''))
  FROM `+b.db.Table("jobs")+` WHERE id = $1), '')`, id).Scan(&s.row); err != nil {
				t.Fatal(err)
			}
		}
		s.rows = b.db.Count(t, `SELECT count(*) FROM `+b.db.Table("jobs"))
		s.events = b.db.Count(t, `SELECT count(*) FROM `+b.db.Table("job_events"))
		s.marker, _ = b.mr.Get(MarkerKey(id))
		return s
	}
	before := read()
	var gen int64
	if before.row != "" {
		r := b.db.Read(t, id)
		gen = r.Generation
	}

	g := NewGuard(b.store, b.markers, WithWorker("W-fuzz"), WithLogger(testLogger(t)))
	g.taskID = testTaskID
	h := &recorder{}
	err := g.Middleware()(h).ProcessTask(context.WithValue(ctx, testTaskIDKey{}, id), asynq.NewTask(typ, payload))

	markerGen, markerOK := parseGeneration(marker)
	refusedUnchanged := func(want error, skip bool) {
		t.Helper()
		if !errors.Is(err, want) || errors.Is(err, asynq.SkipRetry) != skip {
			t.Fatalf("id %q row %q marker %q: guard returned %v, want %v (SkipRetry %v)", id, status, marker, err, want, skip)
		}
		if n := h.runs(); n != 0 {
			t.Fatalf("id %q: handler ran %d times, want 0", id, n)
		}
		if after := read(); after != before {
			t.Fatalf("id %q row %q marker %q: refused, yet something changed: %+v -> %+v", id, status, marker, before, after)
		}
	}
	switch {
	case id == "":
		refusedUnchanged(ErrNoTaskID, true)
	case !storable:
		refusedUnchanged(jobs.ErrBadID, true)
	case status == "":
		refusedUnchanged(jobs.ErrNotFound, false)
	case status == jobs.StatusCompleted:
		refusedUnchanged(nil, false)
	case status == jobs.StatusFailed:
		refusedUnchanged(ErrJobFailed, true)
	case marker != "" && !markerOK:
		refusedUnchanged(ErrBadMarker, false)
	case marker != "" && markerGen >= gen:
		refusedUnchanged(ErrJobReaped, true)
	default:
		if n := h.runs(); n != 1 {
			t.Fatalf("id %q row %q marker %q: handler ran %d times (guard: %v), want once", id, status, marker, n, err)
		}
		if h.leaseE != nil || h.lease.JobID != id || h.lease.Generation != gen+1 {
			t.Fatalf("id %q: the handler's lease is %+v (%v), want job %q generation %d", id, h.lease, h.leaseE, id, gen+1)
		}
		after := read()
		if after.rows != before.rows || after.marker != before.marker {
			t.Fatalf("id %q: rows %d -> %d, marker %q -> %q; the claim writes only its own row", id, before.rows, after.rows, before.marker, after.marker)
		}
	}
}
