package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/jobreaper/jobreaper/config"
	"github.com/jobreaper/jobreaper/internal/pgstore"
	"github.com/jobreaper/jobreaper/jobs"
)

// releasedHold is one hold in release-hold's output.
type releasedHold struct {
	ID         int64     `json:"id"`
	Queues     []string  `json:"queues"`
	Types      []string  `json:"types"`
	Held       int       `json:"held"`
	Tripped    string    `json:"tripped"`
	StartedAt  time.Time `json:"started_at"`
	Until      time.Time `json:"until"`
	ReleasedAt time.Time `json:"released_at"`
	ReleasedBy string    `json:"released_by"`
	Reason     string    `json:"reason"`
}

// releaseHoldDoc is release-hold's JSON output: one document.
type releaseHoldDoc struct {
	Released []releasedHold `json:"released"`
}

func (a *app) releaseHoldCmd() *cobra.Command {
	var reason, output string
	cmd := &cobra.Command{
		Use:   "release-hold --reason TEXT [--queues Q,...] [--output json]",
		Short: "End stall-storm holds at once, so that the next pass reaps the jobs still stalled in their queues",
		Long: `release-hold ends, at once and on the database clock, every stall-storm hold
in effect that names one of --queues (default: the queues setting; empty:
every hold in effect). A hold is ended whole, for every queue it names. The
release is recorded in the hold's row of reaper_holds: released_at,
released_by (user@host of whoever runs the command) and --reason.

A stall-storm hold is what a pass records instead of reaping when more
stalled jobs than max_stalled_per_pass, or more than max_stalled_fraction of
the active tasks it judged, would be reaped at once: workers cut off from
PostgreSQL look exactly like that. Release it once you know the jobs really
hang: the next pass of each of its queues (daemon or run --once) reaps every
job still stalled there, together, without the storm check; the jobs that
made progress meanwhile are left alone. It contacts only PostgreSQL.

It prints one line per hold released (one JSON document with --output json:
{"released":[...]}) and exits 0 when it released a hold, 1 when no hold was
in effect for those queues (nothing changed), 2 when it could not run.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if output != outputText && output != outputJSON {
				return cannotRun("--output %q is not a format: use text or json", output)
			}
			if err := pgstore.CheckOperatorReason(reason); err != nil {
				return cannotRun("release-hold needs --reason TEXT, recorded in the hold's row: %v",
					strings.TrimSuffix(err.Error(), ": "+jobs.ErrInvalidArgument.Error()))
			}
			d, cfg, log, err := a.openOps(cmd, config.ReleaseHoldKeys, false, false)
			if err != nil {
				return err
			}
			defer d.close()
			released, err := d.store.ReleaseHolds(cmd.Context(), pgstore.ReleaseHoldsParams{Queues: cfg.Queues, By: operatorName(), Reason: reason})
			if err != nil {
				return cannotRun("releasing the stall-storm holds failed, nothing was released: %s", oneLine(err.Error()))
			}
			for _, h := range released {
				log.Info("stall-storm hold released: the next pass of its queues reaps the jobs still stalled there",
					"component", "release_hold", "hold_id", h.ID, "queues", h.Queues, "held", h.Held, "until", h.Until,
					"released_by", h.ReleasedBy, "reason", h.Reason)
			}
			if err := printReleased(a.stdout, released, output, cfg.Queues); err != nil {
				return cannotRun("writing the output: %v", err)
			}
			if len(released) == 0 {
				return &exitError{code: exitPassErrors}
			}
			return nil
		},
	}
	config.RegisterFlags(cmd.Flags(), config.ReleaseHoldKeys...)
	cmd.Flags().Lookup("queues").Usage = "release the holds that name one of these queues, comma-separated; empty: every hold in effect"
	cmd.Flags().StringVar(&reason, "reason", "", "why the holds are ended (required; recorded in each hold's row)")
	cmd.Flags().StringVar(&output, "output", outputText, `format on stdout: text or json (one document, {"released":[...]})`)
	return cmd
}

// printReleased writes the holds released, one line each or one JSON
// document; queues are those asked for, for the line saying none was.
func printReleased(w io.Writer, released []pgstore.Hold, output string, queues []string) error {
	if output == outputJSON {
		doc := releaseHoldDoc{Released: []releasedHold{}}
		for _, h := range released {
			r := releasedHold{ID: h.ID, Queues: h.Queues, Types: h.Types, Held: h.Held, Tripped: h.Tripped,
				StartedAt: h.StartedAt, Until: h.Until, ReleasedBy: h.ReleasedBy, Reason: h.Reason}
			if h.ReleasedAt != nil {
				r.ReleasedAt = *h.ReleasedAt
			}
			doc.Released = append(doc.Released, r)
		}
		return json.NewEncoder(w).Encode(doc)
	}
	if len(released) == 0 {
		which := "any queue"
		if len(queues) > 0 {
			which = "queues " + strings.Join(queues, ",")
		}
		_, err := fmt.Fprintf(w, "no stall-storm hold in effect for %s; nothing released\n", which)
		return err
	}
	for _, h := range released {
		if _, err := fmt.Fprintf(w, "released stall-storm hold %d on queues %s (started %s, %d stalled job(s) of types %s held; it would have ended %s): "+
			"the next pass of each queue reaps the jobs still stalled there\n", h.ID, strings.Join(h.Queues, ","),
			h.StartedAt.UTC().Format(time.RFC3339), h.Held, strings.Join(h.Types, ","), h.Until.UTC().Format(time.RFC3339)); err != nil {
			return err
		}
	}
	return nil
}
