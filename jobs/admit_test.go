package jobs_test

import (
	"context"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
)

func TestAdmit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("DecisionsOnTheRow", func(t *testing.T) {
		t.Parallel()
		db := jobstest.New(t)
		store := db.Store()
		db.Insert(t, jobstest.Job{ID: "done", Type: "report.export", Status: jobs.StatusCompleted, Generation: 2})
		db.Insert(t, jobstest.Job{ID: "reaped", Type: "report.export", Status: jobs.StatusFailed, Generation: 3})
		db.Exec(t, `UPDATE `+db.Table("jobs")+` SET failure_reason = 'stalled' WHERE id = 'reaped'`)
		db.Insert(t, jobstest.Job{ID: "marked", Type: "report.export", Status: jobs.StatusProcessing, Generation: 4})
		db.Insert(t, jobstest.Job{ID: "held", Type: "report.export", Status: jobs.StatusQueued, Generation: 1})
		for _, tc := range []struct {
			req     jobs.AdmitRequest
			outcome jobs.AdmitOutcome
			status  string
			gen     int64
			reason  string
		}{
			{jobs.AdmitRequest{JobID: "nobody", Claim: true}, jobs.AdmitNoRow, "", 0, ""},
			{jobs.AdmitRequest{JobID: "done", Claim: true}, jobs.AdmitCompleted, jobs.StatusCompleted, 2, ""},
			{jobs.AdmitRequest{JobID: "reaped", Claim: true}, jobs.AdmitFailed, jobs.StatusFailed, 3, jobs.ReasonStalled},
			{jobs.AdmitRequest{JobID: "marked", Claim: true, HasMarker: true, Marker: 4}, jobs.AdmitMarked, jobs.StatusProcessing, 4, ""},
			{jobs.AdmitRequest{JobID: "marked", Claim: true, HasMarker: true, Marker: 9}, jobs.AdmitMarked, jobs.StatusProcessing, 4, ""},
			{jobs.AdmitRequest{JobID: "held", Claim: false}, jobs.AdmitHeld, jobs.StatusQueued, 1, ""},
		} {
			a, err := store.Admit(ctx, tc.req)
			if err != nil {
				t.Fatalf("%+v: %v", tc.req, err)
			}
			if a.Outcome != tc.outcome || a.Status != tc.status || a.Generation != tc.gen || a.FailureReason != tc.reason {
				t.Fatalf("%+v: admission %+v, want outcome %d on %s generation %d (%q)", tc.req, a, tc.outcome, tc.status, tc.gen, tc.reason)
			}
		}
		for id, want := range map[string]struct {
			status string
			gen    int64
		}{"done": {jobs.StatusCompleted, 2}, "reaped": {jobs.StatusFailed, 3}, "marked": {jobs.StatusProcessing, 4}, "held": {jobs.StatusQueued, 1}} {
			if r := db.Read(t, id); r.Status != want.status || r.Generation != want.gen {
				t.Fatalf("job %s is %s generation %d after a refusal, want %s generation %d", id, r.Status, r.Generation, want.status, want.gen)
			}
			if n := db.Events(t, id, "claimed"); n != 0 {
				t.Fatalf("job %s: %d claimed events after a refusal, want 0", id, n)
			}
		}
	})

	t.Run("ClaimsBelowTheMarkerOfAnEarlierLife", func(t *testing.T) {
		t.Parallel()
		db := jobstest.New(t)
		db.Insert(t, jobstest.Job{ID: "j1", Type: "report.export", Status: jobs.StatusQueued, Generation: 5, Cursor: 2})
		a, err := db.Store().Admit(ctx, jobs.AdmitRequest{JobID: "j1", Worker: "w1", Claim: true, HasMarker: true, Marker: 4})
		if err != nil {
			t.Fatal(err)
		}
		if a.Outcome != jobs.AdmitClaimed || a.Status != jobs.StatusQueued || a.Generation != 5 {
			t.Fatalf("admission %+v, want claimed from QUEUED generation 5", a)
		}
		l := a.Lease
		if l.JobID != "j1" || l.Generation != 6 || l.Worker != "w1" || l.Type != "report.export" || l.Cursor != 2 || l.StartedAt.IsZero() {
			t.Fatalf("lease %+v, want j1 generation 6 by w1 at cursor 2", l)
		}
		if r := db.Read(t, "j1"); r.Status != jobs.StatusProcessing || r.Generation != 6 || r.Worker != "w1" {
			t.Fatalf("row %+v, want PROCESSING generation 6 by w1", r)
		}
		var started, updated bool
		if err := db.Pool.QueryRow(ctx, `SELECT started_at = updated_at, updated_at <= now() FROM `+db.Table("jobs")+` WHERE id = 'j1'`).
			Scan(&started, &updated); err != nil || !started || !updated {
			t.Fatalf("started_at = updated_at: %v, updated_at <= now(): %v (%v)", started, updated, err)
		}
		if n := db.Events(t, "j1", "claimed"); n != 1 {
			t.Fatalf("claimed events = %d, want 1", n)
		}
	})

	// Both statements wait on a row lock another transaction holds, both
	// having seen generation 0; the first to get the lock claims, the
	// other answers from the row as it found it after the wait.
	t.Run("TwoAdmitsOfOneGenerationHaveExactlyOneWinner", func(t *testing.T) {
		t.Parallel()
		db := jobstest.New(t)
		store := db.Store()
		for round := range 5 {
			id := "race-" + string(rune('a'+round))
			db.Insert(t, jobstest.Job{ID: id, Type: "report.export", Status: jobs.StatusQueued})
			holder := lockRow(t, db, id)
			var wg sync.WaitGroup
			adms := make([]jobs.Admission, 2)
			errs := make([]error, 2)
			for w := range 2 {
				wg.Go(func() {
					adms[w], errs[w] = store.Admit(ctx, jobs.AdmitRequest{JobID: id, Worker: "w" + string(rune('1'+w)), Claim: true})
				})
			}
			waitForLockWaiters(t, db, 2)
			if err := holder.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			wg.Wait()
			var won, lost int
			for w := range 2 {
				if errs[w] != nil {
					t.Fatalf("%s: admit %d: %v", id, w, errs[w])
				}
				switch adms[w].Outcome {
				case jobs.AdmitClaimed:
					won++
				case jobs.AdmitLost:
					lost++
					// Answered from the row after the wait: the winner's claim.
					if adms[w].Status != jobs.StatusProcessing || adms[w].Generation != 1 {
						t.Fatalf("%s: lost admission %+v, want the row after the wait (PROCESSING generation 1)", id, adms[w])
					}
				default:
					t.Fatalf("%s: admission %+v, want claimed or lost", id, adms[w])
				}
			}
			if won != 1 || lost != 1 {
				t.Fatalf("%s: %d won and %d lost, want 1 and 1", id, won, lost)
			}
			if r := db.Read(t, id); r.Status != jobs.StatusProcessing || r.Generation != 1 {
				t.Fatalf("%s: row %+v, want PROCESSING generation 1", id, r)
			}
			if n := db.Events(t, id, "claimed"); n != 1 {
				t.Fatalf("%s: claimed events = %d, want 1", id, n)
			}
		}
	})

	// A completion that commits while the admission waits is what the
	// admission answers, not the QUEUED row its snapshot saw.
	t.Run("AnswersFromTheRowAfterTheLockWait", func(t *testing.T) {
		t.Parallel()
		db := jobstest.New(t)
		db.Insert(t, jobstest.Job{ID: "j1", Type: "report.export", Status: jobs.StatusProcessing, Generation: 1})
		holder := lockRow(t, db, "j1")
		if _, err := holder.Exec(ctx, `UPDATE `+db.Table("jobs")+` SET status = 'COMPLETED', finished_at = now() WHERE id = 'j1'`); err != nil {
			t.Fatal(err)
		}
		done := make(chan struct{})
		var a jobs.Admission
		var err error
		go func() {
			defer close(done)
			a, err = db.Store().Admit(ctx, jobs.AdmitRequest{JobID: "j1", Worker: "w2", Claim: true})
		}()
		waitForLockWaiters(t, db, 1)
		if err := holder.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		<-done
		if err != nil || a.Outcome != jobs.AdmitCompleted || a.Status != jobs.StatusCompleted || a.Generation != 1 {
			t.Fatalf("admission %+v (%v), want COMPLETED generation 1", a, err)
		}
		if r := db.Read(t, "j1"); r.Status != jobs.StatusCompleted || r.Generation != 1 {
			t.Fatalf("row %+v, want COMPLETED generation 1", r)
		}
	})
}

// lockRow opens a transaction that holds id's row lock (an UPDATE that
// changes nothing the admission reads) until the caller commits it.
func lockRow(t *testing.T, db *jobstest.DB, id string) pgx.Tx {
	t.Helper()
	tx, err := db.Pool.Begin(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	if _, err := tx.Exec(context.Background(), `UPDATE `+db.Table("jobs")+` SET worker = worker WHERE id = $1`, id); err != nil {
		t.Fatal(err)
	}
	return tx
}

// waitForLockWaiters waits until n statements on db's schema wait for a
// lock (the shared server runs other tests' statements too).
func waitForLockWaiters(t *testing.T, db *jobstest.DB, n int64) {
	t.Helper()
	jobstest.Eventually(t, "admissions waiting on the row lock", func() bool {
		return db.Count(t, `SELECT count(*) FROM pg_stat_activity
 WHERE wait_event_type = 'Lock' AND position($1 in query) > 0`, db.Schema) >= n
	})
}

// The product deletes a job's row and inserts the ID again in one
// transaction while the start guard's Admit waits for the row's lock. The
// waiting statement's snapshot cannot see the new row, but the job exists:
// Admit answers from the new life (it claims it, as a delivery a moment
// later would), never "no row", which asynq would count as a failed
// attempt and so spend a retry of a job that is there.
func TestAdmitOfARowReplacedByANewLifeWhileItWaitedClaimsTheNewLife(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := jobstest.New(t)
	db.JobType(t, "report.export", "1 hour", "", "")
	store := db.Store()
	db.Insert(t, jobstest.Job{ID: "R", Type: "report.export", Status: jobs.StatusQueued})
	first := claim(t, store, "R", 0, "W1")
	product, pid := conn(t, db)
	for _, sql := range []string{`BEGIN`, `DELETE FROM jobs WHERE id = 'R'`,
		`INSERT INTO jobs (id, type, status) VALUES ('R', 'report.export', 'QUEUED')`} {
		if _, err := product.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	type answer struct {
		a   jobs.Admission
		err error
	}
	out := make(chan answer, 1)
	go func() {
		a, err := store.Admit(ctx, jobs.AdmitRequest{JobID: "R", Worker: "W2", Claim: true})
		out <- answer{a, err}
	}()
	jobstest.Eventually(t, "Admit waits for the row's lock", func() bool {
		return db.Count(t, `SELECT count(*) FROM pg_stat_activity
 WHERE wait_event_type = 'Lock' AND pid <> $1 AND position($2 in query) > 0`, pid, db.Schema) == 1
	})
	if _, err := product.Exec(ctx, `COMMIT`); err != nil {
		t.Fatal(err)
	}
	got := <-out
	if got.err != nil || got.a.Outcome != jobs.AdmitClaimed || got.a.Lease.Generation <= first.Generation || got.a.Lease.Worker != "W2" {
		t.Fatalf("Admit after the row was replaced = %+v, %v; want the new life claimed by W2 above generation %d", got.a, got.err, first.Generation)
	}
	row := db.Read(t, "R")
	if row.Status != jobs.StatusProcessing || row.Generation != got.a.Lease.Generation {
		t.Fatalf("row after the admit = %+v, want PROCESSING at generation %d", row, got.a.Lease.Generation)
	}
}
