package main

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/jobreaper/jobreaper/internal/idcheck"
	"github.com/jobreaper/jobreaper/internal/pgstore"
)

// dryRunShown is how many IDs a bulk --dry-run prints.
const dryRunShown = 20

// bulkFlags are the flags that select jobs by filter in requeue and
// cancel, besides each command's own time flags.
type bulkFlags struct {
	types  []string
	limit  int
	dryRun bool
}

// register adds --where-type, --limit and --dry-run to cmd; verb is the
// command's ("requeue", "cancel").
func (b *bulkFlags) register(cmd *cobra.Command, verb string) {
	cmd.Flags().StringSliceVar(&b.types, "where-type", nil, "with a time filter: only jobs of these types, comma-separated")
	cmd.Flags().IntVar(&b.limit, "limit", 0, fmt.Sprintf("with a time filter: the most jobs to %s, 1 to %d (required)", verb, pgstore.BulkLimitMax))
	cmd.Flags().BoolVar(&b.dryRun, "dry-run", false, fmt.Sprintf("with a time filter: print how many jobs match and the first %d IDs, and %s none", dryRunShown, verb))
}

// changed reports whether any of b's flags was given.
func (b *bulkFlags) changed(cmd *cobra.Command) bool {
	return cmd.Flags().Changed("where-type") || cmd.Flags().Changed("limit") || cmd.Flags().Changed("dry-run")
}

// check returns the usage error of a bulk form's --limit and lists, nil
// when they are good.
func (b *bulkFlags) check(cmd *cobra.Command) error {
	switch {
	case !cmd.Flags().Changed("limit"):
		return cannotRun("--limit N is required with a time filter: the most jobs one run may change, 1 to %d", pgstore.BulkLimitMax)
	case b.limit < 1 || b.limit > pgstore.BulkLimitMax:
		return cannotRun("--limit %d is not between 1 and %d: narrow the filter, or run again after this batch", b.limit, pgstore.BulkLimitMax)
	}
	return checkList("--where-type", b.types)
}

// checkList returns a usage error when a comma-separated list flag holds an
// empty item.
func checkList(flag string, items []string) error {
	for i, it := range items {
		if strings.TrimSpace(it) == "" {
			return cannotRun("%s item %d is empty: name one, or leave the flag out", flag, i+1)
		}
	}
	return nil
}

// parseTimeBound reads a time flag: an RFC 3339 time or a duration ago
// (Go syntax: 2h, 90m, 1h30m), counted on the database's clock.
func parseTimeBound(flag, s string) (pgstore.TimeBound, error) {
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return pgstore.TimeBound{At: t}, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 {
		return pgstore.TimeBound{}, cannotRun("%s %q is neither an RFC 3339 time (2026-01-02T15:04:05Z) nor a positive duration ago (2h, 90m)", flag, s)
	}
	return pgstore.TimeBound{Ago: d}, nil
}

// dryRunLine is the output of a bulk --dry-run: one line, one JSON object
// with --output json.
type dryRunLine struct {
	DryRun bool `json:"dry_run"`
	// Matched is how many jobs match the filter; Selected how many of them
	// a run with the same --limit would take (the oldest first).
	Matched  int `json:"matched"`
	Selected int `json:"selected"`
	Limit    int `json:"limit"`
	// JobIDs are the first 20 selected.
	JobIDs []string `json:"job_ids"`
}

// printBulkDryRun prints what a bulk run of verb ("requeue", "cancel") would
// take; nothing was changed.
func printBulkDryRun(a *app, verb string, sel pgstore.BulkSelection, limit int, output string) error {
	shown := sel.IDs[:min(len(sel.IDs), dryRunShown)]
	if output == outputJSON {
		return json.NewEncoder(a.stdout).Encode(dryRunLine{DryRun: true, Matched: sel.Matched, Selected: len(sel.IDs), Limit: limit, JobIDs: shown})
	}
	quoted := make([]string, len(shown))
	for i, id := range shown {
		quoted[i] = idcheck.QuoteID(id)
	}
	ids := "none"
	if len(quoted) > 0 {
		ids = strings.Join(quoted, ", ")
		if len(sel.IDs) > len(shown) {
			ids += ", ..."
		}
	}
	_, err := fmt.Fprintf(a.stdout, "dry run: %d job(s) match; a run would %s %d of them (--limit %d); nothing changed; first IDs: %s\n",
		sel.Matched, verb, len(sel.IDs), limit, ids)
	return err
}
