package jobs_test

import (
	"context"
	"testing"
	"time"

	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
)

// TestFlows runs the seed's flows once each way: the attempt completes, or
// it is reaped first and its late completion changes nothing.
func TestFlows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	// stalled claims job id and makes it look stalled to the reaper.
	stalled := func(t *testing.T, db *jobstest.DB, store *jobs.Store, j jobstest.Job) jobs.Lease {
		lease := queued(t, db, store, j, "w1")
		backdate(t, db, j.ID, 2*time.Hour, time.Hour)
		return lease
	}

	t.Run("CourseCompletionWritesChapterLessonLectureAndCountWithTheCompletion", func(t *testing.T) {
		t.Parallel()
		db, store := setup(t, nil)
		db.Exec(t, jobstest.CourseSchema)
		db.Exec(t, `INSERT INTO courses (id) VALUES ('c1')`)
		lease := queued(t, db, store, jobstest.Job{ID: "j1", Type: "report.export", ParentID: "c1"}, "w1")
		_, err := jobstest.AddChapters(ctx, store, db, lease)
		requireNoErr(t, err)
		requireRow(t, db, "j1", jobs.StatusCompleted, 1, 0)
		requireCount(t, db, 1, `SELECT count(*) FROM chapters WHERE job_id = 'j1'`)
		requireCount(t, db, 1, `SELECT count(*) FROM lessons`)
		requireCount(t, db, 1, `SELECT count(*) FROM lectures`)
		requireCount(t, db, 1, `SELECT chapter_count FROM courses WHERE id = 'c1'`)
	})

	t.Run("ReapedCourseJobWritesNoChapterLessonLectureOrCount", func(t *testing.T) {
		t.Parallel()
		db, store := setup(t, nil)
		db.Exec(t, jobstest.CourseSchema)
		db.Exec(t, `INSERT INTO courses (id) VALUES ('c1')`)
		lease := stalled(t, db, store, jobstest.Job{ID: "j1", Type: "report.export", ParentID: "c1"})
		if !reap(t, store, "j1") {
			t.Fatal("not reaped")
		}
		_, err := jobstest.AddChapters(ctx, store, db, lease)
		requireIs(t, err, jobs.ErrJobTerminal)
		requireRow(t, db, "j1", jobs.StatusFailed, 1, 0)
		for _, table := range []string{"chapters", "lessons", "lectures"} {
			requireCount(t, db, 0, `SELECT count(*) FROM `+table)
		}
		requireCount(t, db, 0, `SELECT chapter_count FROM courses WHERE id = 'c1'`)
	})

	t.Run("VideoIsReadyAtCompletionAndChargedOnlyAfterAllMetadata", func(t *testing.T) {
		t.Parallel()
		db, store := setup(t, nil)
		db.Exec(t, jobstest.VideoSchema)
		db.Exec(t, `INSERT INTO videos (id) VALUES ('v1'), ('v2')`)
		good := queued(t, db, store, jobstest.Job{ID: "j1", Type: "video.transcode", ParentID: "v1", TenantID: "t1"}, "w1")
		charged, err := jobstest.ComposeVideo(ctx, store, db, good, false)
		requireNoErr(t, err)
		if !charged {
			t.Fatal("not charged")
		}
		requireCount(t, db, 1, `SELECT count(*) FROM videos WHERE id = 'v1' AND status = 'READY' AND title IS NOT NULL AND duration_s = 42 AND thumbnail IS NOT NULL`)
		requireCount(t, db, 1, `SELECT count(*) FROM usage WHERE job_id = 'j1' AND tenant_id = 't1'`)

		bad := queued(t, db, store, jobstest.Job{ID: "j2", Type: "video.transcode", ParentID: "v2"}, "w1")
		charged, err = jobstest.ComposeVideo(ctx, store, db, bad, true)
		if err == nil || charged {
			t.Fatalf("a failed metadata update: charged = %v, err = %v", charged, err)
		}
		requireRow(t, db, "j2", jobs.StatusCompleted, 1, 0)
		requireCount(t, db, 1, `SELECT count(*) FROM videos WHERE id = 'v2' AND status = 'READY' AND duration_s IS NULL AND thumbnail IS NULL`)
		requireCount(t, db, 0, `SELECT count(*) FROM usage WHERE job_id = 'j2'`)
	})

	t.Run("ReapedVideoJobIsNeitherReadyNorDescribedNorCharged", func(t *testing.T) {
		t.Parallel()
		db, store := setup(t, nil)
		db.Exec(t, jobstest.VideoSchema)
		db.Exec(t, `INSERT INTO videos (id) VALUES ('v1')`)
		lease := stalled(t, db, store, jobstest.Job{ID: "j1", Type: "video.transcode", ParentID: "v1"})
		backdate(t, db, "j1", 3*time.Hour, time.Hour) // video.transcode allows 120 min
		if !reap(t, store, "j1") {
			t.Fatal("not reaped")
		}
		charged, err := jobstest.ComposeVideo(ctx, store, db, lease, false)
		requireIs(t, err, jobs.ErrJobTerminal)
		if charged {
			t.Fatal("charged")
		}
		requireCount(t, db, 1, `SELECT count(*) FROM videos WHERE status = 'RENDERING' AND title IS NULL AND duration_s IS NULL`)
		requireCount(t, db, 0, `SELECT count(*) FROM usage`)
	})

	t.Run("ReapedExportFailsTheExportRowAndLeavesTheSourceReady", func(t *testing.T) {
		t.Parallel()
		db, store := setup(t, jobstest.ExportCascades)
		db.Exec(t, jobstest.ExportSchema)
		db.Exec(t, `INSERT INTO sources (id) VALUES ('s1'); INSERT INTO exports (id, source_id) VALUES ('e1', 's1'), ('e2', 's1')`)
		late := stalled(t, db, store, jobstest.Job{ID: "j1", Type: "report.export", ParentID: "e1"})
		if !reap(t, store, "j1") {
			t.Fatal("not reaped")
		}
		requireIs(t, jobstest.Export(ctx, store, db, late), jobs.ErrJobTerminal)
		requireCount(t, db, 1, `SELECT count(*) FROM exports WHERE id = 'e1' AND status = 'FAILED' AND url IS NULL`)
		requireCount(t, db, 1, `SELECT count(*) FROM sources WHERE id = 's1' AND status = 'READY' AND exported_at IS NULL`)

		ok := queued(t, db, store, jobstest.Job{ID: "j2", Type: "report.export", ParentID: "e2"}, "w1")
		requireNoErr(t, jobstest.Export(ctx, store, db, ok))
		requireCount(t, db, 1, `SELECT count(*) FROM exports WHERE id = 'e2' AND status = 'DONE' AND url = 's3://exports/j2:1.csv'`)
		requireCount(t, db, 1, `SELECT count(*) FROM sources WHERE id = 's1' AND status = 'READY' AND exported_at IS NOT NULL`)
	})

	t.Run("ParentIsReadyOnceWhenAllChildrenCompleteAndNeverBecauseOfAFailedChild", func(t *testing.T) {
		t.Parallel()
		db, store := setup(t, jobstest.ParentCascades("video.transcode", true))
		db.Exec(t, jobstest.ParentSchema)
		db.Exec(t, `INSERT INTO parents (id, pending) VALUES ('p1', 2), ('p2', 2)`)
		for _, id := range []string{"a1", "a2"} {
			lease := queued(t, db, store, jobstest.Job{ID: id, Type: "video.transcode", ParentID: "p1"}, "w1")
			_, err := jobstest.CompleteChild(ctx, store, db, lease)
			requireNoErr(t, err)
		}
		if p, err := jobstest.ReadParent(ctx, db, "p1"); err != nil || p != (jobstest.ParentState{Status: "READY", Pending: 0, Completed: 2, Failed: 0}) {
			t.Fatalf("p1 = %+v, %v", p, err)
		}
		requireCount(t, db, 1, `SELECT count(*) FROM parent_events WHERE parent_id = 'p1' AND kind = 'ready'`)

		b1 := queued(t, db, store, jobstest.Job{ID: "b1", Type: "video.transcode", ParentID: "p2"}, "w1")
		requireNoErr(t, store.Fail(ctx, b1, "render_failed"))
		b2 := queued(t, db, store, jobstest.Job{ID: "b2", Type: "video.transcode", ParentID: "p2"}, "w1")
		_, err := jobstest.CompleteChild(ctx, store, db, b2)
		requireNoErr(t, err)
		if p, err := jobstest.ReadParent(ctx, db, "p2"); err != nil || p != (jobstest.ParentState{Status: "FAILED", Pending: 0, Completed: 1, Failed: 1}) {
			t.Fatalf("p2 = %+v, %v", p, err)
		}
		requireCount(t, db, 0, `SELECT count(*) FROM parent_events WHERE parent_id = 'p2' AND kind = 'ready'`)
		requireCount(t, db, 1, `SELECT count(*) FROM notifications WHERE job_id = 'b1'`)
	})
}
