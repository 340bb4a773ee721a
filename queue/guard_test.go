package queue

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
)

func TestGuard(t *testing.T) {
	t.Parallel()

	t.Run("MarkerOfTheCurrentGenerationRefusesWithoutRunningTheHandler", func(t *testing.T) {
		t.Parallel()
		b := setupGuard(t)
		// The row still reads PROCESSING so that only the marker can refuse.
		b.db.Insert(t, jobstest.Job{ID: "J1", Type: "report.export", Generation: 1, Worker: "W1", StartedAgo: jobstest.Ago(time.Hour), IdleAgo: 40 * time.Minute})
		if _, err := writeMarker(t.Context(), b.markers, "J1", 1, MarkerTTL); err != nil {
			t.Fatal(err)
		}
		h := &recorder{}
		err := deliver(t.Context(), b.guard(t, "W2", nil, nil), "J1", h)
		requireRefused(t, err, ErrJobReaped, h)
		if !strings.Contains(err.Error(), "jobreaper:reaped:J1 records generation 1") {
			t.Fatalf("refusal %q does not name the marker and its generation", err)
		}
		requireRow(t, b.db, "J1", jobs.StatusProcessing, 1)
		if n := b.db.Events(t, "J1", "claimed"); n != 0 {
			t.Fatalf("claimed events = %d, want 0", n)
		}
		if got := b.decisions("refused_reaped"); got != 1 {
			t.Fatalf("refused_reaped decisions = %v, want 1", got)
		}
	})

	t.Run("MarkerAboveTheRowsGenerationRefusesAndSaysWhereItComesFrom", func(t *testing.T) {
		t.Parallel()
		b := setupGuard(t)
		// A QUEUED row at generation 2 under a marker of generation 5: no
		// reap of this row set it (another schema on the same Redis).
		b.db.Insert(t, jobstest.Job{ID: "J1", Type: "report.export", Status: jobs.StatusQueued, Generation: 2})
		if _, err := writeMarker(t.Context(), b.markers, "J1", 5, MarkerTTL); err != nil {
			t.Fatal(err)
		}
		var logs strings.Builder
		var mu sync.Mutex
		g := NewGuard(b.store, b.markers, WithWorker("W2"), WithRegisterer(b.reg),
			WithLogger(slog.New(slog.NewTextHandler(lockedWriter{&mu, &logs}, nil))))
		g.taskID = testTaskID
		h := &recorder{}
		err := deliver(t.Context(), g, "J1", h)
		requireRefused(t, err, ErrJobReaped, h)
		requireRow(t, b.db, "J1", jobs.StatusQueued, 2)
		mu.Lock()
		defer mu.Unlock()
		if !strings.Contains(logs.String(), "marker records a generation above the row's") ||
			!strings.Contains(logs.String(), "another schema on the same Redis database") {
			t.Fatalf("guard log lacks the explanation of a foreign marker:\n%s", logs.String())
		}
	})

	t.Run("MarkerOfAnOlderGenerationDoesNotRefuseARequeuedJob", func(t *testing.T) {
		t.Parallel()
		b := setupGuard(t)
		b.db.Insert(t, jobstest.Job{ID: "J1", Type: "report.export", Status: jobs.StatusQueued, Generation: 2})
		if _, err := writeMarker(t.Context(), b.markers, "J1", 1, MarkerTTL); err != nil {
			t.Fatal(err)
		}
		h := &recorder{}
		if err := deliver(t.Context(), b.guard(t, "W2", nil, nil), "J1", h); err != nil {
			t.Fatalf("guard returned %v, want nil", err)
		}
		if h.runs() != 1 || h.lease.Generation != 3 {
			t.Fatalf("handler ran %d times with lease generation %d, want once with generation 3", h.runs(), h.lease.Generation)
		}
	})

	t.Run("FailedRowRefusesEvenWhenTheMarkerIsGone", func(t *testing.T) {
		t.Parallel()
		b := setupGuard(t)
		b.db.Insert(t, jobstest.Job{ID: "J1", Type: "report.export", Generation: 1, Worker: "W1", StartedAgo: jobstest.Ago(time.Hour)})
		failRow(t, b.db, "J1", jobs.ReasonStalled)
		h := &recorder{}
		err := deliver(t.Context(), b.guard(t, "W2", nil, nil), "J1", h)
		requireRefused(t, err, ErrJobReaped, h)
		requireRow(t, b.db, "J1", jobs.StatusFailed, 1)
	})

	t.Run("RowFailedForAnotherReasonRefusesAsFailed", func(t *testing.T) {
		t.Parallel()
		b := setupGuard(t)
		b.db.Insert(t, jobstest.Job{ID: "J1", Type: "report.export", Generation: 1})
		failRow(t, b.db, "J1", "no_completion")
		h := &recorder{}
		err := deliver(t.Context(), b.guard(t, "W2", nil, nil), "J1", h)
		requireRefused(t, err, ErrJobFailed, h)
		if errors.Is(err, ErrJobReaped) {
			t.Fatalf("a job failed as no_completion was reported as reaped: %v", err)
		}
	})

	t.Run("CompletedRowIsAcknowledgedWithoutRunningTheHandler", func(t *testing.T) {
		t.Parallel()
		b := setupGuard(t)
		b.db.Insert(t, jobstest.Job{ID: "J1", Type: "report.export", Status: jobs.StatusCompleted, Generation: 1})
		h := &recorder{}
		if err := deliver(t.Context(), b.guard(t, "W2", nil, nil), "J1", h); err != nil {
			t.Fatalf("guard returned %v, want nil so that asynq acknowledges the task", err)
		}
		if h.runs() != 0 {
			t.Fatalf("handler ran %d times, want 0", h.runs())
		}
		requireRow(t, b.db, "J1", jobs.StatusCompleted, 1)
	})

	t.Run("QueuedRowIsClaimedAndTheHandlerGetsTheLease", func(t *testing.T) {
		t.Parallel()
		b := setupGuard(t)
		b.db.Insert(t, jobstest.Job{ID: "J1", Type: "report.export", Status: jobs.StatusQueued, Generation: 4, Queue: "exports"})
		h := &recorder{}
		if err := deliver(t.Context(), b.guard(t, "W2", nil, nil), "J1", h); err != nil {
			t.Fatalf("guard returned %v, want nil", err)
		}
		if h.runs() != 1 || h.leaseE != nil {
			t.Fatalf("handler ran %d times, lease from context err %v; want once with a lease", h.runs(), h.leaseE)
		}
		if h.lease.JobID != "J1" || h.lease.Generation != 5 || h.lease.Worker != "W2" || h.lease.Queue != "exports" {
			t.Fatalf("lease = %+v, want job J1 generation 5 worker W2 queue exports", h.lease)
		}
		r := requireRow(t, b.db, "J1", jobs.StatusCompleted, 5) // auto_complete type, handler returned nil
		if r.Worker != "W2" {
			t.Fatalf("row worker = %q, want W2", r.Worker)
		}
		if n := b.db.Events(t, "J1", "claimed"); n != 1 {
			t.Fatalf("claimed events = %d, want 1", n)
		}
		if got := b.decisions("claimed"); got != 1 {
			t.Fatalf("claimed decisions = %v, want 1", got)
		}
	})

	t.Run("PostgreSQLUnreachableFailsClosed", func(t *testing.T) {
		t.Parallel()
		b := setupGuard(t)
		// Nothing listens on port 1; the password must not leak into the error.
		pool, err := pgxpool.New(t.Context(), "postgres://jobreaper:s3cret-pw@127.0.0.1:1/test?connect_timeout=2")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		h := &recorder{}
		err = deliver(t.Context(), b.guard(t, "W2", jobs.NewStore(pool), nil), "J1", h)
		requireUnavailable(t, err, h)
		if strings.Contains(err.Error(), "s3cret-pw") {
			t.Fatalf("guard error leaks the database password: %v", err)
		}
		if got := b.decisions("unavailable"); got != 1 {
			t.Fatalf("unavailable decisions = %v, want 1", got)
		}
	})

	t.Run("RedisUnreachableFailsClosed", func(t *testing.T) {
		t.Parallel()
		b := setupGuard(t)
		b.db.Insert(t, jobstest.Job{ID: "J1", Type: "report.export", Status: jobs.StatusQueued})
		b.mr.Close()
		h := &recorder{}
		err := deliver(t.Context(), b.guard(t, "W2", nil, nil), "J1", h)
		requireUnavailable(t, err, h)
		if !strings.Contains(err.Error(), "reading the marker") {
			t.Fatalf("guard error %q does not say the marker could not be read", err)
		}
		requireRow(t, b.db, "J1", jobs.StatusQueued, 0)
		if n := b.db.Events(t, "J1", "claimed"); n != 0 {
			t.Fatalf("claimed events = %d, want 0", n)
		}
	})

	t.Run("ClaimFailingForAnotherReasonFailsClosed", func(t *testing.T) {
		t.Parallel()
		b := setupGuard(t)
		b.db.Insert(t, jobstest.Job{ID: "J1", Type: "report.export", Status: jobs.StatusQueued})
		store := &failingClaim{Store: b.store, err: errors.New("jobs.Claim: connection reset by peer")}
		h := &recorder{}
		err := deliver(t.Context(), b.guard(t, "W2", store, nil), "J1", h)
		requireUnavailable(t, err, h)
		if !strings.Contains(err.Error(), "claiming the job") {
			t.Fatalf("guard error %q does not say the claim failed", err)
		}
	})

	t.Run("MissingRowIsRetriedAndCountsAsAFailure", func(t *testing.T) {
		t.Parallel()
		b := setupGuard(t)
		h := &recorder{}
		err := deliver(t.Context(), b.guard(t, "W2", nil, nil), "J-nobody", h)
		if !errors.Is(err, jobs.ErrNotFound) || errors.Is(err, asynq.SkipRetry) || errors.Is(err, ErrGuardUnavailable) || !IsFailure(err) {
			t.Fatalf("guard returned %v, want a retryable failure wrapping jobs.ErrNotFound", err)
		}
		if h.runs() != 0 {
			t.Fatalf("handler ran %d times, want 0", h.runs())
		}
	})

	t.Run("TaskWithoutIDIsRefused", func(t *testing.T) {
		t.Parallel()
		b := setupGuard(t)
		g := b.guard(t, "W2", nil, nil)
		h := &recorder{}
		err := g.Middleware()(h).ProcessTask(t.Context(), asynq.NewTask("report.export", nil))
		requireRefused(t, err, ErrNoTaskID, h)
	})

	t.Run("TwoGuardsRacingOnOneQueuedJobRunTheHandlerOnce", func(t *testing.T) {
		t.Parallel()
		b := setupGuard(t)
		const jobsN = 10
		for i := range jobsN {
			b.db.Insert(t, jobstest.Job{ID: "J" + strconv.Itoa(i), Type: "report.export", Status: jobs.StatusQueued})
		}
		for i := range jobsN {
			id := "J" + strconv.Itoa(i)
			// Both guards read generation 0 before either claims, so the
			// claims really race for one generation.
			read := &readBarrier{Store: b.store}
			read.wg.Add(2)
			h := &recorder{}
			errs := make([]error, 2)
			var wg sync.WaitGroup
			for w := range 2 {
				g := b.guard(t, "W"+strconv.Itoa(w+1), read, nil)
				wg.Go(func() { errs[w] = deliver(t.Context(), g, id, h) })
			}
			wg.Wait()
			if h.runs() != 1 {
				t.Fatalf("job %s: handler ran %d times, want exactly once", id, h.runs())
			}
			var won, lost int
			for _, err := range errs {
				switch {
				case err == nil:
					won++
				case errors.Is(err, jobs.ErrClaimLost) && errors.Is(err, asynq.SkipRetry):
					lost++
				default:
					t.Fatalf("job %s: guard returned %v, want nil or a lost claim with SkipRetry", id, err)
				}
			}
			if won != 1 || lost != 1 {
				t.Fatalf("job %s: %d guards won and %d lost, want 1 and 1", id, won, lost)
			}
			requireRow(t, b.db, id, jobs.StatusCompleted, 1)
			if n := b.db.Events(t, id, "claimed"); n != 1 {
				t.Fatalf("job %s: claimed events = %d, want 1", id, n)
			}
		}
	})

	// A fencing error whose job is not this task's (the handler passed on
	// the error of a child job's lease) says nothing about this job, which
	// is still PROCESSING at its generation: it is an ordinary error. The
	// outcome mapping tests cover a handler whose own job moved on.
	t.Run("FencingErrorOfAnotherJobIsAnOrdinaryError", func(t *testing.T) {
		t.Parallel()
		b := setupGuard(t)
		for _, tc := range []struct {
			id        string
			result    error
			skipRetry bool
		}{
			{"J-stale", fmt.Errorf("advance child: %w", jobs.ErrStaleWorker), false},
			{"J-terminal", fmt.Errorf("complete child: %w", jobs.ErrJobTerminal), false},
			{"J-other", errors.New("upstream 503"), false},
		} {
			b.db.Insert(t, jobstest.Job{ID: tc.id, Type: "report.export", Status: jobs.StatusQueued})
			h := &recorder{result: tc.result}
			err := deliver(t.Context(), b.guard(t, "W2", nil, nil), tc.id, h)
			if h.runs() != 1 || !errors.Is(err, tc.result) || errors.Is(err, asynq.SkipRetry) != tc.skipRetry {
				t.Fatalf("%s: handler ran %d times, guard returned %v; want once, wrapping the handler's error, SkipRetry %v",
					tc.id, h.runs(), err, tc.skipRetry)
			}
		}
	})

	t.Run("DefaultWorkerIsHostnameAndPID", func(t *testing.T) {
		t.Parallel()
		host, _ := os.Hostname()
		g := NewGuard(nil, nil)
		if want := host + ":" + strconv.Itoa(os.Getpid()); g.worker != want {
			t.Fatalf("default worker = %q, want %q", g.worker, want)
		}
	})
}

func TestIsFailure(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"NilIsNoFailure", nil, false},
		{"GuardUnavailableIsNoFailure", fmt.Errorf("queue.Guard: job J1: %w: dial tcp: refused", ErrGuardUnavailable), false},
		{"MissingRowIsAFailure", fmt.Errorf("queue.Guard: %w", jobs.ErrNotFound), true},
		{"HandlerErrorIsAFailure", errors.New("upstream 503"), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := IsFailure(tc.err); got != tc.want {
				t.Fatalf("IsFailure(%v) = %v, want %v", tc.err, got, tc.want)
			}
		})
	}
}

// lockedWriter serialises the writes of a logger shared by goroutines.
type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
