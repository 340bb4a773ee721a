package jobs_test

import (
	"context"
	"testing"
	"time"

	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
)

// A claim, through Claim or Admit, returns the type's max_runtime and its
// own stall_timeout in the same statement: 0 for a NULL stall_timeout (the
// daemon's default applies) and both 0 for a type without a job_types row.
// Months and days convert as PostgreSQL compares intervals.
func TestClaimReturnsTheTypesLimits(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := jobstest.New(t)
	db.JobType(t, "own.stall", "20 seconds", "7 seconds", "")
	db.JobType(t, "default.stall", "1 mon 2 days 03:04:05.5", "", "")
	store := db.Store()
	want := map[string][2]time.Duration{
		"own.stall":     {20 * time.Second, 7 * time.Second},
		"default.stall": {32*24*time.Hour + 3*time.Hour + 4*time.Minute + 5500*time.Millisecond, 0},
		"unknown.type":  {0, 0},
	}
	check := func(how string, l jobs.Lease) {
		t.Helper()
		w := want[l.Type]
		if l.MaxRuntime != w[0] || l.StallTimeout != w[1] {
			t.Errorf("%s of a %s job: max_runtime %s, stall timeout %s; want %s and %s", how, l.Type, l.MaxRuntime, l.StallTimeout, w[0], w[1])
		}
	}
	for typ := range want {
		db.Insert(t, jobstest.Job{ID: "c-" + typ, Type: typ, Status: jobs.StatusQueued})
		db.Insert(t, jobstest.Job{ID: "a-" + typ, Type: typ, Status: jobs.StatusQueued})
		l, err := store.Claim(ctx, "c-"+typ, 0, "w1")
		requireNoErr(t, err)
		check("Claim", l)
		a, err := store.Admit(ctx, jobs.AdmitRequest{JobID: "a-" + typ, Worker: "w1", Claim: true})
		requireNoErr(t, err)
		if a.Outcome != jobs.AdmitClaimed {
			t.Fatalf("Admit of a-%s = %+v, want claimed", typ, a)
		}
		check("Admit", a.Lease)
	}
}
