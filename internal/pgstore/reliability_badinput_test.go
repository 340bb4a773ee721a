package pgstore_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/jobreaper/jobreaper/internal/idcheck"
	"github.com/jobreaper/jobreaper/internal/pgstore"
	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
)

// TestReliabilityBadInput_Limits: a job type's limit at zero or below
// (max_runtime, stall_timeout, hard_timeout, including a mixed-sign
// interval that compares as zero) is refused by the schema with an error
// naming the column's rule, and no row is written. Limits that are only
// too small or absurdly large are the reaper's to skip (see
// TestReliabilityBadInput_Pass).
func TestReliabilityBadInput_Limits(t *testing.T) {
	t.Parallel()
	tally := jobstest.NewBadInputs(t)
	db := jobstest.New(t)
	for _, tc := range []struct {
		name, column, maxRuntime, stall, hard string
	}{
		{"MaxRuntimeZero", "max_runtime", "0", "", ""},
		{"MaxRuntimeNegative", "max_runtime", "-30 minutes", "", ""},
		{"MaxRuntimeMixedSignsComparingAsZero", "max_runtime", "1 mon -30 days", "", ""},
		{"StallTimeoutZero", "stall_timeout", "30 minutes", "0", ""},
		{"StallTimeoutNegative", "stall_timeout", "30 minutes", "-15 minutes", ""},
		{"HardTimeoutZero", "hard_timeout", "30 minutes", "", "0"},
		{"HardTimeoutNegative", "hard_timeout", "30 minutes", "", "-1 day"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tally.Try(t)
			_, err := db.Pool.Exec(context.Background(), `INSERT INTO job_types (name, max_runtime, stall_timeout, hard_timeout)
VALUES ($1, $2::interval, nullif($3, '')::interval, nullif($4, '')::interval)`, tc.name, tc.maxRuntime, tc.stall, tc.hard)
			var pgErr *pgconn.PgError
			if !errors.As(err, &pgErr) || pgErr.Code != "23514" || pgErr.ConstraintName != "job_types_"+tc.column+"_check" {
				t.Fatalf("insert = %v, want a check violation of job_types_%s_check", err, tc.column)
			}
			if n := db.Count(t, `SELECT count(*) FROM job_types WHERE name = $1`, tc.name); n != 0 {
				t.Fatalf("%d rows written", n)
			}
		})
	}
}

// TestReliabilityBadInput_JobIDs gives the store's ID-taking operations
// (Get, Claim, Inspect, Cancel, Requeue) IDs that cannot be a job's (empty,
// a NUL byte, invalid UTF-8, over jobs.MaxIDLength) and odd IDs that match
// no row (quotes, braces, spaces, SQL, non-ASCII, 1 KB): each answers an
// error a caller can test with errors.Is (jobs.ErrBadID, ErrNotFound or
// ErrInvalidArgument), never a panic, and nothing is written. A row with an
// odd ID next to them is untouched.
func TestReliabilityBadInput_JobIDs(t *testing.T) {
	t.Parallel()
	tally := jobstest.NewBadInputs(t)
	db := jobstest.New(t)
	db.JobType(t, "report.export", "30 minutes", "", "")
	db.Insert(t, jobstest.Job{ID: `row "kept" {as is}`, Type: "report.export", Status: jobs.StatusQueued, Generation: 0, Queue: "q"})
	store := stores(db, nil)
	ctx := context.Background()
	var ids []string
	for _, id := range []string{"", "nul\x00byte", "bad-\xff\xfe-utf8", strings.Repeat("L", jobs.MaxIDLength+1),
		`it's "quoted"`, "{braces}", "with spaces", "'; DROP TABLE jobs; --", "rapport-été-日本", strings.Repeat("k", jobs.MaxIDLength)} {
		ids = append(ids, id)
	}
	ops := map[string]func(id string) error{
		"Get": func(id string) error { _, err := store.Get(ctx, id); return err },
		"Claim": func(id string) error {
			_, err := store.Claim(ctx, id, 0, "W1")
			return err
		},
		"Inspect": func(id string) error { _, err := store.Inspect(ctx, id, 5, 5); return err },
		"Cancel": func(id string) error {
			_, err := store.Cancel(ctx, pgstore.CancelParams{JobID: id, Reason: "bad input test"})
			return err
		},
		"Requeue": func(id string) error {
			_, err := store.Requeue(ctx, pgstore.RequeueParams{JobID: id, Status: jobs.StatusFailed, Generation: 1, Reason: "bad input test"})
			return err
		},
	}
	before := db.Count(t, `SELECT count(*) FROM job_events`)
	kept := db.Read(t, `row "kept" {as is}`)
	for name, op := range ops {
		for _, id := range ids {
			t.Run(name+"/"+idcheck.QuoteID(id), func(t *testing.T) {
				tally.Try(t)
				err := op(id)
				if err == nil {
					t.Fatalf("%s(%s) = nil, want an error", name, idcheck.QuoteID(id))
				}
				bad := jobs.CheckID(id) != nil
				switch {
				case errors.Is(err, jobs.ErrBadID), errors.Is(err, jobs.ErrNotFound), errors.Is(err, jobs.ErrInvalidArgument),
					errors.Is(err, jobs.ErrClaimLost) && !bad, errors.Is(err, pgstore.ErrChangedSinceRead) && !bad:
				default:
					t.Fatalf("%s(%s) = %v, want an error wrapping jobs.ErrBadID, ErrNotFound or ErrInvalidArgument", name, idcheck.QuoteID(id), err)
				}
				if bad && !errors.Is(err, jobs.ErrBadID) && !errors.Is(err, jobs.ErrInvalidArgument) {
					t.Fatalf("%s(%s) = %v, want jobs.ErrBadID: the ID cannot be a job's", name, idcheck.QuoteID(id), err)
				}
			})
		}
	}
	t.Cleanup(func() {
		if n := db.Count(t, `SELECT count(*) FROM job_events`); n != before {
			t.Errorf("job_events: %d rows, was %d", n, before)
		}
		if got := db.Read(t, `row "kept" {as is}`); got != kept {
			t.Errorf("the odd-ID row changed: %+v -> %+v", kept, got)
		}
		if n := db.Count(t, `SELECT count(*) FROM jobs`); n != 1 {
			t.Errorf("jobs holds %d rows, want the one row", n)
		}
	})
}
