package reaper

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/jobreaper/jobreaper/internal/broken"
	"github.com/jobreaper/jobreaper/internal/pgstore"
)

// readClock takes the pass's one clock reading (pgstore.Store.PassClock) and
// sets the stall rule the pass judges by, res.rule: Options.Rule with, when
// Options.OutageGrace is on, the end of the last PostgreSQL outage, which a
// dry run computes without writing. A new outage end recorded by this
// pass is logged, and so, once, a timeline PostgreSQL refuses to read.
func (r *Reaper) readClock(ctx context.Context, res *Result) (time.Time, error) {
	c, err := r.store.PassClock(ctx, pgstore.PassClockParams{Grace: r.opts.OutageGrace, Record: !r.opts.DryRun, RecordedBy: r.recorder})
	if err != nil {
		return time.Time{}, err
	}
	res.rule = r.opts.Rule
	res.rule.OutageEnd = c.OutageEnd
	if broken.Grace {
		res.rule.OutageEnd = time.Time{}
	}
	if c.TimelineRefused {
		r.log.Warn("PostgreSQL refuses pg_control_checkpoint() to this role, so a promotion after a failover is seen only " +
			"through lost connections or a changed postmaster start; grant EXECUTE on it to keep the outage grace complete")
	}
	if c.Cause != "" {
		verb := "recorded"
		if r.opts.DryRun {
			verb = "found (a dry run records nothing)"
		}
		r.log.Info("PostgreSQL outage end "+verb+": jobs idle since before it are held for one stall timeout after it (outage_grace)",
			"outage_end", c.OutageEnd, "cause", c.Cause, "db_now", c.Now)
	}
	return c.Now, nil
}

// logHeld says, once per pass, how many jobs the outage grace held: at
// debug level, since holding changes nothing (the recorded outage end was
// logged at info, and jobreaper_jobs_skipped_total counts the holds).
func (r *Reaper) logHeld(res *Result) {
	if n := res.Skipped[string(SkipOutageGrace)]; n > 0 {
		r.log.Debug("jobs held by the outage grace: stalled by their idle time, but idle time never counts across a PostgreSQL outage",
			"held", n, "outage_end", res.rule.OutageEnd)
	}
}

// recorder names this process in the outage row: host:pid.
func recorder() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown"
	}
	return fmt.Sprintf("%s:%d", host, os.Getpid())
}
