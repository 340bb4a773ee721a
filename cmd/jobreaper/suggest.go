package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/spf13/cobra"

	"github.com/jobreaper/jobreaper/config"
	"github.com/jobreaper/jobreaper/internal/limits"
	"github.com/jobreaper/jobreaper/internal/pgstore"
	"github.com/jobreaper/jobreaper/jobs"
)

// suggestWindowDefault is suggest-limits' default window: a week holds a
// weekly peak and enough attempts of a type that runs a few times an hour.
const suggestWindowDefault = "7d"

func (a *app) suggestLimitsCmd() *cobra.Command {
	var window, typ, output string
	cmd := &cobra.Command{
		Use:   "suggest-limits [--window 7d] [--type T] [--output json]",
		Short: "Suggest each job type's max_runtime and stall_timeout from how its jobs ran in a window",
		Long: `suggest-limits reads, per job type, the finished attempts of the window
(--window, Go duration or days: 7d, 36h; default 7d) from their completed
and failed events (failures of the handler; reaps are left out, since they
would teach the limits their own hang), and prints: how many there were,
their runtime p50/p95/p99/max, their longest progress gap (max_idle_gap)
p50/p99/max, the reaps and how long each job had been reapable when it was
reaped, the jobs reaped while alive (a Complete or Advance of the reaped
generation came back later: false reaps a too-short stall timeout makes,
whose gaps also feed the suggestion), the type's limits as the daemon
applies them, and a suggestion with the SQL that applies it:

  max_runtime   = 1.25 x p99 runtime, rounded up to a whole minute, and at
                  least the p99 plus one heartbeat interval
  stall_timeout = 2 x p99 max_idle_gap, rounded up to a whole minute, and
                  at least 2 x heartbeat_interval + interval

Where those would reach the type's hard_timeout (the type would be skipped
as bad_limits), it also suggests a hard_timeout, which applies to newly
enqueued tasks only. A type with fewer than 100 finished attempts in the
window says "not enough data" and suggests nothing. Percentiles are
PostgreSQL's percentile_cont. It never writes, and contacts only
PostgreSQL; the reaper role is enough. Exit 0, or 2 when it could not run.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if output != outputText && output != outputJSON {
				return cannotRun("--output %q is not a format: use text or json", output)
			}
			w, err := parseAge(window)
			if err != nil || w == 0 {
				if err == nil {
					err = fmt.Errorf("the window must be longer than 0")
				}
				return cannotRun("--window %q: %v", window, err)
			}
			d, cfg, _, err := a.openOps(cmd, config.SuggestLimitsKeys, false, false)
			if err != nil {
				return err
			}
			defer d.close()
			rep, err := suggestLimits(cmd.Context(), d.store, cfg, w, typ)
			if err != nil {
				return cannotRun("reading the events of the window failed: %s", oneLine(err.Error()))
			}
			if typ != "" && len(rep.Types) == 0 {
				return cannotRun("--type %q: no such job type in job_types", typ)
			}
			if err := printSuggest(a.stdout, rep, output); err != nil {
				return cannotRun("writing the output: %v", err)
			}
			return nil
		},
	}
	config.RegisterFlags(cmd.Flags(), config.SuggestLimitsKeys...)
	cmd.Flags().StringVar(&window, "window", suggestWindowDefault, "how far back to read finished attempts (Go duration or days: 7d, 36h)")
	cmd.Flags().StringVar(&typ, "type", "", "only this job type (default: every type of job_types)")
	cmd.Flags().StringVar(&output, "output", outputText, `format on stdout: text or json (one document, {"window_seconds":...,"types":[...]})`)
	return cmd
}

// suggestLimits measures the window's events (one read-only statement) and
// computes each type's suggestion with limits.Suggest.
func suggestLimits(ctx context.Context, store *pgstore.Store, cfg config.Config, window time.Duration, typ string) (limits.Report, error) {
	stats, err := store.WindowStats(ctx, pgstore.WindowStatsParams{Window: window, Type: typ,
		DefaultStallTimeout: cfg.StallTimeout, DefaultHardTimeout: jobs.HardTimeoutDefault})
	if err != nil {
		return limits.Report{}, err
	}
	rep := limits.Report{WindowSeconds: window.Seconds(), Types: []limits.TypeReport{}}
	table := pgx.Identifier{cfg.Schema, "job_types"}.Sanitize()
	for _, st := range stats {
		r := limits.TypeReport{Type: st.Type, Attempts: st.Attempts, Reaps: st.Reaps, ReapedWhileAlive: st.ReapedWhileAlive,
			RuntimeSeconds:    limits.Quantiles{P50: st.Runtime.P50, P95: st.Runtime.P95, P99: st.Runtime.P99, Max: st.Runtime.Max},
			MaxIdleGapSeconds: limits.Quantiles{P50: st.Gap.P50, P99: st.Gap.P99, Max: st.Gap.Max},
			ReapDelaySeconds:  limits.Quantiles{P50: st.ReapDelay.P50, Max: st.ReapDelay.Max},
			MaxRuntimeSeconds: st.MaxRuntime.Seconds(), StallTimeoutSeconds: st.StallTimeout.Seconds(), HardTimeoutSeconds: st.HardTimeout.Seconds(),
		}
		r.Apply(limits.Suggest(limits.Input{Type: st.Type, Table: table, Attempts: st.Attempts,
			RuntimeP99: secondsOf(st.Runtime.P99), GapP99: secondsOf(st.Gap.P99),
			HeartbeatInterval: cfg.HeartbeatInterval, MinStallTimeout: cfg.MinStallTimeout(),
			MaxRuntime: st.MaxRuntime, StallTimeout: st.StallTimeout, HardTimeout: st.HardTimeout}))
		rep.Types = append(rep.Types, r)
	}
	return rep, nil
}

// secondsOf turns seconds into a Duration (microseconds kept); nil is 0.
func secondsOf(s *float64) time.Duration {
	if s == nil {
		return 0
	}
	return time.Duration(*s*1e6) * time.Microsecond
}

// printSuggest writes rep as one JSON document or, for people, a block per
// type.
func printSuggest(w io.Writer, rep limits.Report, output string) error {
	if output == outputJSON {
		return json.NewEncoder(w).Encode(rep)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "window %s\n", secondsText(rep.WindowSeconds))
	for _, t := range rep.Types {
		fmt.Fprintf(&b, "\ntype %s: %d finished attempt(s), %d reap(s), %d reaped while alive\n", t.Type, t.Attempts, t.Reaps, t.ReapedWhileAlive)
		q := t.RuntimeSeconds
		fmt.Fprintf(&b, "  runtime        p50 %s  p95 %s  p99 %s  max %s\n", optSeconds(q.P50), optSeconds(q.P95), optSeconds(q.P99), optSeconds(q.Max))
		q = t.MaxIdleGapSeconds
		fmt.Fprintf(&b, "  max_idle_gap   p50 %s  p99 %s  max %s\n", optSeconds(q.P50), optSeconds(q.P99), optSeconds(q.Max))
		if t.Reaps > 0 {
			fmt.Fprintf(&b, "  reap delay     p50 %s  max %s\n", optSeconds(t.ReapDelaySeconds.P50), optSeconds(t.ReapDelaySeconds.Max))
		}
		fmt.Fprintf(&b, "  limits         max_runtime %s  stall_timeout %s  hard_timeout %s\n",
			secondsText(t.MaxRuntimeSeconds), secondsText(t.StallTimeoutSeconds), secondsText(t.HardTimeoutSeconds))
		if t.SuggestedMaxRuntimeSeconds != nil {
			fmt.Fprintf(&b, "  suggested      max_runtime %s  stall_timeout %s", optSeconds(t.SuggestedMaxRuntimeSeconds), optSeconds(t.SuggestedStallTimeoutSeconds))
			if t.SuggestedHardTimeoutSeconds != nil {
				fmt.Fprintf(&b, "  hard_timeout %s", optSeconds(t.SuggestedHardTimeoutSeconds))
			}
			fmt.Fprintf(&b, "\n  %s\n", t.SQL)
		}
		if t.Note != "" {
			fmt.Fprintf(&b, "  note: %s\n", t.Note)
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// secondsText writes seconds as a Go duration, to the millisecond.
func secondsText(s float64) string {
	return (time.Duration(s*1e3) * time.Millisecond).String()
}

// optSeconds is secondsText, or "-" for no value.
func optSeconds(s *float64) string {
	if s == nil {
		return "-"
	}
	return secondsText(*s)
}
