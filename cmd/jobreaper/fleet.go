package main

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/spf13/cobra"

	"github.com/jobreaper/jobreaper/config"
	"github.com/jobreaper/jobreaper/internal/asynqstate"
	"github.com/jobreaper/jobreaper/internal/idcheck"
	"github.com/jobreaper/jobreaper/internal/pgstore"
	"github.com/jobreaper/jobreaper/reaper"
)

// runMode is how `jobreaper run` runs: as a daemon or once, with or
// without the leader lease, cancel on reap and dry run.
type runMode struct {
	// daemon: the loop with its start jitter, metrics and leader lease.
	daemon  bool
	metrics *reaper.Metrics
	// leaderLease: one replica per queue set runs passes (--leader-lease).
	leaderLease bool
	// cancelOnReap: asynq's cancel for each reaped active task
	// (--cancel-on-reap).
	cancelOnReap bool
	// dryRun: write nothing, list every decision (--dry-run, with --once).
	dryRun bool
}

// register defines run's fleet flags.
func (m *runMode) register(cmd *cobra.Command) {
	cmd.Flags().BoolVar(&m.leaderLease, "leader-lease", true,
		"run passes only while this replica holds its queue set's leader lease (one replica per set works; the others wait); "+
			"false runs every replica's passes (correctness never depends on it); ignored by --once")
	cmd.Flags().BoolVar(&m.cancelOnReap, "cancel-on-reap", true,
		"after a reap, ask asynq to cancel the running handler of each reaped task that was active, so its worker slot is freed")
	cmd.Flags().BoolVar(&m.dryRun, "dry-run", false,
		"with --once: write nothing (no UPDATE, event, marker, cascade or cancel) and list every decision the pass would act on")
}

// leaderSetup is a daemon's leader lease: its holder identity and key, or
// nothing (run --once, --leader-lease=false).
type leaderSetup struct {
	on     bool
	holder pgstore.LeaderLeaseHolder
	key    string
	// ttl is the leader lease's TTL, which also bounds how long a reap
	// transaction may sit idle holding the leader lease row.
	ttl time.Duration
}

// leader returns the leader lease setup of this run.
func (m runMode) leader(cfg config.Config, log *slog.Logger) leaderSetup {
	if !m.daemon || !m.leaderLease || m.dryRun {
		if m.daemon {
			log.With("component", "leader_lease").Info("running without a leader lease (--leader-lease=false): this replica runs every pass")
			m.metrics.SetLeaderWithoutLease()
		}
		return leaderSetup{}
	}
	return leaderSetup{on: true, holder: pgstore.NewLeaderLeaseHolder(time.Now()), key: pgstore.LeaderLeaseKey(cfg.Queues),
		ttl: reaper.LeaderLeaseTTL(cfg.Interval)}
}

// storeOptions makes the Store's reap transactions check the leader lease
// before COMMIT, holding its row until then, and sit idle for at most its
// TTL, when the daemon uses one.
func (l leaderSetup) storeOptions() []pgstore.Option {
	if !l.on {
		return nil
	}
	return []pgstore.Option{pgstore.WithLeaderLease(l.key, l.holder.ID), pgstore.WithLeaderLeaseTTL(l.ttl)}
}

// fleetOptions sets the reaper options of the leader lease and cancel on
// reap. Its error says the Redis URL cannot be named for the settings
// drift check (which connecting to it has already refused).
func (m runMode) fleetOptions(opts *reaper.Options, store *pgstore.Store, l leaderSetup, rdb redis.UniversalClient, cfg config.Config, log *slog.Logger) error {
	if l.on {
		settings, err := m.settings(cfg)
		if err != nil {
			return err
		}
		opts.LeaderLease = reaper.NewLeaderLease(store, cfg.Queues, l.holder, cfg.Interval, settings, log, m.metrics)
	}
	if m.daemon && !m.dryRun {
		// The status page of every replica reads the leader's record; a
		// daemon without a leader lease records its own passes there too.
		holder := l.holder
		if !l.on {
			holder = pgstore.NewLeaderLeaseHolder(time.Now())
		}
		opts.PassRecord = &reaper.PassRecord{Store: store, Key: pgstore.LeaderLeaseKey(cfg.Queues), HolderID: holder.ID, HolderHost: holder.Host}
	}
	if m.cancelOnReap && !m.dryRun {
		opts.Canceller = asynqstate.NewCanceller(rdb, cfg.OpTimeout)
	}
	if !m.dryRun {
		// A retry reap cancels the running handler whatever cancel on reap
		// says (the retry needs its worker slot), and replaces a lost job's
		// archived or completed task.
		opts.RetryCanceller = asynqstate.NewCanceller(rdb, cfg.OpTimeout)
		opts.Replacer = asynqstate.NewRetryReplacer(rdb, store)
	}
	return nil
}

// settings are the settings that decide what this daemon does as the
// leader, which the replicas of its queue set compare (settings drift):
// one line per setting.
func (m runMode) settings(cfg config.Config) (reaper.Settings, error) {
	redisID, err := asynqstate.RedisID(cfg.RedisURL)
	if err != nil {
		return reaper.Settings{}, fmt.Errorf("redis_url: %w", err)
	}
	s := reaper.NewSettings(cfg.Interval, cfg.HeartbeatInterval, cfg.StallTimeout, cfg.Queues, cfg.Cascades)
	s.Redis = redisID
	s.MaxLostPerPass = cfg.MaxLostPerPass
	s.StaleQueuedAfter = cfg.StaleQueuedAfter.String()
	s.StaleQueuedLookupsPerPass = cfg.StaleQueuedLookupsPerPass
	s.CancelOnReap = m.cancelOnReap
	s.OutageGrace = cfg.OutageGraceOn()
	s.MaxStalledPerPass = cfg.MaxStalledPerPass
	s.MaxStalledFraction = cfg.MaxStalledFraction
	s.StallStormHold = cfg.StallStormHold.String()
	return s, nil
}

// dryRunDoc is the JSON form of `run --once --dry-run --output json`: the
// summary's fields plus one decision per job looked at.
type dryRunDoc struct {
	reaper.Result
	Decisions []reaper.Decision `json:"decisions"`
}

// printDryRun writes a dry run's summary and decisions: one JSON document,
// or the summary line then one line per decision.
func printDryRun(w io.Writer, res reaper.Result, output string) error {
	res = forScripts(res)
	decisions := res.Decisions
	if decisions == nil {
		decisions = []reaper.Decision{}
	}
	if output == outputJSON {
		return json.NewEncoder(w).Encode(dryRunDoc{Result: res, Decisions: decisions})
	}
	var b strings.Builder
	fmt.Fprintf(&b, "dry run, nothing written: would reap %d of %d job(s) looked at\n", res.Reaped, len(decisions))
	for _, d := range decisions {
		verb := "skip"
		if d.Decision == reaper.DecisionReap {
			verb = "REAP"
		}
		worker := d.Worker
		if worker == "" {
			worker = "-"
		}
		risk := ""
		if d.AtRisk {
			risk = " (at risk)"
		}
		fmt.Fprintf(&b, "%-4s %-16s job %s type %s queue %s generation %d worker %s: runtime %s of max %s, idle %s of stall timeout %s%s\n",
			verb, d.Reason, idcheck.QuoteID(d.JobID), orNone(d.Type), orNone(d.Queue), d.Generation, worker,
			secs(d.RuntimeSeconds), secs(d.MaxRuntimeSeconds), secs(d.IdleSeconds), secs(d.StallTimeoutSeconds), retryNote(d)+risk)
	}
	if _, err := io.WriteString(w, b.String()); err != nil {
		return err
	}
	return printResult(w, res, outputText, "")
}

// retryNote says what a dry run's reap would do with the job: run it again
// within its type's reap_retries ("reap (retry 1 of 2)") or fail it
// ("reap (fail)"); "" for a skip.
func retryNote(d reaper.Decision) string {
	switch {
	case d.Decision != reaper.DecisionReap:
		return ""
	case d.Retry > 0:
		return fmt.Sprintf(", reap (retry %d of %d)", d.Retry, d.Retries)
	}
	return ", reap (fail)"
}

func secs(s float64) string {
	return time.Duration(s * float64(time.Second)).Round(time.Second).String()
}
