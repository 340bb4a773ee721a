package main

import (
	"github.com/spf13/cobra"

	"github.com/jobreaper/jobreaper/cmd/jobreaper/demo"
)

// demoCmd runs the self-contained demo. It reads --database-url and
// --redis-url only when they were given; otherwise the demo itself reads
// JOBREAPER_DATABASE_URL / JOBREAPER_REDIS_URL, then tries the local
// defaults, then starts stand-ins. The daemon's required-setting checks do
// not apply.
func (a *app) demoCmd() *cobra.Command {
	var verbose bool
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Show a hung job reaped and its late result refused, on real asynq workers (about 10 s)",
		Long: `demo runs an asynq worker with the start guard in-process, enqueues jobs
with limits of seconds (a hung one, a slow but progressing one, a quick one
and a resumable one), runs real reaper passes and narrates what happens,
checking every claim against PostgreSQL and Redis.

It uses --database-url / --redis-url when given, else JOBREAPER_DATABASE_URL /
JOBREAPER_REDIS_URL, else 127.0.0.1:5432 and 127.0.0.1:6379; where nothing
answers it starts throwaway stand-ins (a temporary PostgreSQL cluster from
the installed server binaries, and an in-process Redis). It works in its own
schema and queue and removes them at exit.

Exit codes: 0 the story held, 1 it did not (the reason is printed), 2 it
could not start (what to install or start is printed).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			opts := demo.Options{Verbose: verbose}
			flags := cmd.Flags()
			if flags.Changed("database-url") {
				opts.DatabaseURL, _ = flags.GetString("database-url")
			}
			if flags.Changed("redis-url") {
				opts.RedisURL, _ = flags.GetString("redis-url")
			}
			if code := demo.Run(cmd.Context(), opts, a.stdout, a.stderr); code != exitOK {
				return &exitError{code: code}
			}
			return nil
		},
	}
	cmd.Flags().String("database-url", "", "PostgreSQL URL to use (default: JOBREAPER_DATABASE_URL, else 127.0.0.1:5432, else a throwaway cluster)")
	cmd.Flags().String("redis-url", "", "Redis URL to use (default: JOBREAPER_REDIS_URL, else 127.0.0.1:6379, else an in-process Redis)")
	cmd.Flags().BoolVar(&verbose, "verbose", false, "also log the guard's, asynq's and the reaper's own lines to stderr")
	return cmd
}
