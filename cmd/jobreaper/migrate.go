package main

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/jobreaper/jobreaper/config"
	"github.com/jobreaper/jobreaper/internal/redact"
	"github.com/jobreaper/jobreaper/jobs"
)

func (a *app) migrateCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "migrate",
		Short: "Create or update jobreaper's tables in --schema (idempotent; contacts only PostgreSQL)",
		Long: `migrate creates the schema named by --schema if it is missing and applies every
pending migration (the tables docs/schema.md lists: job_types, jobs,
job_events, job_batches and the daemon's own). Running it again
applies nothing. Concurrent runs against one schema wait for each other.
It contacts only PostgreSQL, and prints the versions it applied.

Before it changes anything it checks --schema for tables (and indexes and
functions) it would create that already exist and are not jobreaper's, such
as a product's own jobs table in public: if there are any, it changes
nothing, names them and exits 2. Give jobreaper a schema of its own then
(--schema jobreaper) and the same --schema to run and to the workers.

It checks only --database-url, --schema, --op-timeout and the log settings:
the daemon's other settings (the stall rule, --redis-url, --queues,
--metrics-addr, cascades, ...) are not checked, so a migration is never
stopped by one of them. An unknown key in the config file still stops it,
since it may be a misspelt --schema.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := a.loadConfig(cmd, config.MigrateKeys...)
			if err != nil {
				return err
			}
			log := newLogger(cfg, a.stderr).With("component", "migrate")
			ctx := cmd.Context()
			pool, err := connectPostgres(ctx, cfg)
			if err != nil {
				return err
			}
			defer pool.Close()
			applied, err := jobs.Migrate(ctx, pool, cfg.Schema)
			if errors.Is(err, jobs.ErrSchemaConflict) {
				// The error names the objects and suggests --schema.
				return cannotRun("migrate refused: %s", strings.TrimSuffix(strings.TrimPrefix(err.Error(), "jobs.Migrate: "), ": "+jobs.ErrSchemaConflict.Error()))
			}
			if err != nil {
				return cannotRun("migrating schema %q of the PostgreSQL database %s failed: %v; nothing after the failed version was applied, fix the cause and run migrate again",
					cfg.Schema, redact.URL(cfg.DatabaseURL), err)
			}
			if len(applied) == 0 {
				fmt.Fprintf(a.stdout, "schema %q is up to date: no migration applied\n", cfg.Schema)
				return nil
			}
			versions := make([]string, len(applied))
			for i, v := range applied {
				versions[i] = strconv.FormatInt(v, 10)
			}
			log.Info("migrations applied", "schema", cfg.Schema, "versions", versions)
			fmt.Fprintf(a.stdout, "applied %d migration(s) to schema %q: %s\n", len(applied), cfg.Schema, strings.Join(versions, ", "))
			return nil
		},
	}
	config.RegisterFlags(cmd.Flags(), config.MigrateKeys...)
	return cmd
}
