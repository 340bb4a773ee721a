package queue

import (
	"errors"
	"strings"
	"testing"

	"github.com/hibiken/asynq"

	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
)

// A row whose type has no job_types row would be skipped by the reaper as
// unknown_type on every pass: Enqueue and Enqueuer.Enqueue refuse it,
// naming the type, and nothing reaches asynq. Once the type is registered
// the same call enqueues: the check reads job_types at every call, so no
// stale answer outlives the registration.
func TestEnqueueRefusesAnUnknownType(t *testing.T) {
	t.Parallel()
	rc := realRedis(t)
	queue := unique(t, "unknown-")
	deleteQueueAtCleanup(t, rc, queue)
	b := setupEnqueue(t, rc)
	enq := NewEnqueuer(rc, b.store)
	idA, idB := unique(t, "Junk-a-"), unique(t, "Junk-b-")
	for _, id := range []string{idA, idB} {
		b.db.Insert(t, jobstest.Job{ID: id, Type: "thumbnail.render", Status: jobs.StatusQueued, Queue: queue})
	}
	task := asynq.NewTask("thumbnail.render", nil)

	calls := map[string]func(id string) error{
		"Enqueue": func(id string) error {
			_, err := Enqueue(t.Context(), b.client, b.store, task, id)
			return err
		},
		"Enqueuer.Enqueue": func(id string) error {
			_, err := enq.Enqueue(t.Context(), task, id)
			return err
		},
	}
	for name, call := range calls {
		for _, id := range []string{idA, idB} {
			err := call(id)
			if !errors.Is(err, jobs.ErrUnknownType) {
				t.Fatalf("%s of job %s with an unregistered type: err = %v, want jobs.ErrUnknownType", name, id, err)
			}
			if !strings.Contains(err.Error(), `type "thumbnail.render"`) || !strings.Contains(err.Error(), id) {
				t.Fatalf("%s: error %q does not name the type and the job", name, err)
			}
			requireNoTask(t, b.insp, queue, id)
			requireRow(t, b.db, id, jobs.StatusQueued, 0)
			// The hint names the Store's schema, and says what becomes of
			// the row the product committed.
			register := `INSERT INTO "` + b.db.Schema + `".job_types (name, max_runtime) VALUES ('thumbnail.render', ...)`
			for _, want := range []string{`in schema "` + b.db.Schema + `" (register it: ` + register + `)`,
				"nothing was enqueued and the job row you committed stays QUEUED without a task",
				"register the type, then call Enqueue again for this job (or delete the row)"} {
				if !strings.Contains(err.Error(), want) {
					t.Fatalf("%s: error %q\nlacks %q", name, err, want)
				}
			}
		}
	}

	// The statement of the hint, completed, registers the type where the
	// Store reads it.
	b.db.Exec(t, strings.Replace(`INSERT INTO "`+b.db.Schema+`".job_types (name, max_runtime) VALUES ('thumbnail.render', ...)`,
		"...", "'5 minutes'", 1))
	b.db.Exec(t, `UPDATE job_types SET hard_timeout = '40 minutes' WHERE name = 'thumbnail.render'`)
	if err := calls["Enqueue"](idA); err != nil {
		t.Fatalf("Enqueue after the type was registered: %v", err)
	}
	if err := calls["Enqueuer.Enqueue"](idB); err != nil {
		t.Fatalf("Enqueuer.Enqueue after the type was registered: %v", err)
	}
	for _, id := range []string{idA, idB} {
		info, err := b.insp.GetTaskInfo(queue, id)
		if err != nil || info.State != asynq.TaskStatePending || info.Timeout.String() != "40m0s" {
			t.Fatalf("task %s = %+v (%v), want pending with the type's 40m hard timeout", id, info, err)
		}
	}
}
