package jobs_test

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
)

func TestClaim(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("ClaimMovesQueuedJobToProcessingWithNextGeneration", func(t *testing.T) {
		t.Parallel()
		db := jobstest.New(t)
		db.Insert(t, jobstest.Job{ID: "j1", Type: "report.export", Status: jobs.StatusQueued, Cursor: 3})
		store := db.Store()
		lease, err := store.Claim(ctx, "j1", 0, "w1")
		if err != nil {
			t.Fatal(err)
		}
		if lease.Generation != 1 || lease.Worker != "w1" || lease.Cursor != 3 || lease.FencingToken() != "j1:1" {
			t.Fatalf("lease = %+v", lease)
		}
		row := db.Read(t, "j1")
		if row.Status != jobs.StatusProcessing || row.Generation != 1 || row.Worker != "w1" {
			t.Fatalf("row = %+v", row)
		}
		if n := db.Events(t, "j1", "claimed"); n != 1 {
			t.Fatalf("claimed events = %d, want 1", n)
		}
	})

	t.Run("ClaimOfTerminalJobIsLost", func(t *testing.T) {
		t.Parallel()
		db := jobstest.New(t)
		db.Insert(t, jobstest.Job{ID: "j1", Type: "report.export", Status: jobs.StatusFailed, Generation: 1})
		_, err := db.Store().Claim(ctx, "j1", 1, "w1")
		if !errors.Is(err, jobs.ErrClaimLost) {
			t.Fatalf("err = %v, want ErrClaimLost", err)
		}
		if row := db.Read(t, "j1"); row.Status != jobs.StatusFailed || row.Generation != 1 {
			t.Fatalf("row = %+v", row)
		}
	})

	t.Run("TwoConcurrentClaimsOfOneGenerationHaveExactlyOneWinner", func(t *testing.T) {
		t.Parallel()
		db := jobstest.New(t)
		store := db.Store()
		const rounds, racers = 20, 8
		for r := 0; r < rounds; r++ {
			id := "race-" + string(rune('a'+r))
			db.Insert(t, jobstest.Job{ID: id, Type: "report.export", Status: jobs.StatusQueued})
			var (
				wg         sync.WaitGroup
				mu         sync.Mutex
				wins, lost int
				start      = make(chan struct{})
			)
			for i := 0; i < racers; i++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					_, err := store.Claim(ctx, id, 0, "w")
					mu.Lock()
					defer mu.Unlock()
					switch {
					case err == nil:
						wins++
					case errors.Is(err, jobs.ErrClaimLost):
						lost++
					default:
						t.Errorf("claim: %v", err)
					}
				}()
			}
			close(start)
			wg.Wait()
			if wins != 1 || lost != racers-1 {
				t.Fatalf("round %d: wins = %d, lost = %d; want 1 and %d", r, wins, lost, racers-1)
			}
			if row := db.Read(t, id); row.Generation != 1 {
				t.Fatalf("generation = %d, want 1", row.Generation)
			}
		}
	})
}
