package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"

	"github.com/spf13/cobra"
)

// Exit codes, the same for every command.
const (
	// exitOK: the pass was clean, the migration ran, or the daemon was
	// stopped by a signal.
	exitOK = 0
	// exitPassErrors: the pass ran but counted errors (a queue that could
	// not be listed, a row load, task lookup, reap or marker write that
	// failed), or it panicked; see the log. The next pass retries the listing, the load,
	// the lookup and the reap, and a later pass re-sets a marker whose
	// write failed; the job's FAILED row refuses its task meanwhile.
	exitPassErrors = 1
	// exitCannotRun: nothing ran: bad flags or config, PostgreSQL or Redis
	// unreachable, schema not migrated.
	exitCannotRun = 2
	// exitPanicked: the daemon (run) stopped because reaper.PanickedPassesMax
	// passes in a row panicked; it released its leader lease first. A code
	// of its own, not 0, so that systemd's Restart=on-failure and
	// Kubernetes restart it, and not 2, which says a setting or a server
	// is at fault.
	exitPanicked = 3
)

// exitError carries a command's exit code to execute. A nil err means the
// command has already said everything (stdout and the log) and only the
// code is left.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string {
	if e.err == nil {
		return fmt.Sprintf("exit code %d", e.code)
	}
	return e.err.Error()
}

func (e *exitError) Unwrap() error { return e.err }

// cannotRun returns an exit-2 error whose message is the problem and what
// to do next.
func cannotRun(format string, args ...any) error {
	return &exitError{code: exitCannotRun, err: fmt.Errorf(format, args...)}
}

// app is what every command shares: where output goes and the environment
// configuration is read from.
type app struct {
	stdout, stderr io.Writer
	environ        []string
	// args is the command line, without the program name.
	args []string
}

// execute runs the command line args (without the program name) and
// returns the process's exit code. main is the only caller besides tests,
// which capture stdout and stderr.
func execute(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	a := &app{stdout: stdout, stderr: stderr, environ: os.Environ(), args: args}
	root := a.rootCmd()
	root.SetArgs(hoistLeadingFlags(root, args))
	cmd, err := root.ExecuteContextC(ctx)
	if err == nil {
		return exitOK
	}
	var ee *exitError
	if errors.As(err, &ee) {
		if ee.err != nil {
			fmt.Fprintf(stderr, "jobreaper: %s\n", oneLine(ee.err.Error()))
		}
		return ee.code
	}
	// cobra's own errors: an unknown command or flag, a flag value of the
	// wrong type, a stray argument, a required flag left out. The help to
	// see is the command's that refused.
	path := root.CommandPath()
	if cmd != nil {
		path = cmd.CommandPath()
	}
	fmt.Fprintf(stderr, "jobreaper: %s; see %s --help\n", oneLine(err.Error()), path)
	return exitCannotRun
}

func (a *app) rootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:   "jobreaper",
		Short: "Recover stalled jobs on asynq queues backed by a PostgreSQL jobs table",
		Long: `jobreaper fails PROCESSING jobs whose asynq task stopped making progress
(runtime past the type's max_runtime and no progress for the stall timeout),
runs the type's failure cascade, and sets a Redis marker so that the start
guard refuses the task and a late result is rejected.

Settings come from, lowest precedence first: defaults, the YAML file named by
--config (or JOBREAPER_CONFIG), the environment (JOBREAPER_<KEY>, e.g.
JOBREAPER_STALL_TIMEOUT), and the flags below. Durations use Go syntax:
90s, 5m, 1h30m.

Exit codes: 0 done (run --once: a clean pass); 1 run --once: the pass had
errors or panicked, the mass-loss limit held its lost_task reaps back, a
stall-storm hold is on for its queues, it held marker writes
(markers_held), or a signal stopped it before its end; requeue, cancel: a job was refused or failed; inspect: no such job;
prune: refused or stopped; release-hold: no hold was in effect; 2 could not
run; 3 run (the daemon): 3 passes in a row panicked, so it released its
leader lease and stopped to be restarted. docs/operating.md, "Exit codes", has
the whole table.`,
		SilenceErrors: true,
		SilenceUsage:  true,
		Args:          cobra.NoArgs,
		Version:       version(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			return cannotRun("a command is required: migrate, run, inspect, requeue, cancel, prune, release-hold, suggest-limits, demo or version; see jobreaper --help")
		},
	}
	root.SetVersionTemplate("jobreaper {{.Version}}\n")
	root.SetOut(a.stdout)
	root.SetErr(a.stderr)
	root.SetFlagErrorFunc(func(cmd *cobra.Command, err error) error {
		e := cannotRun("%s; see %s --help", flagProblem(cmd, err), cmd.CommandPath())
		// The flags could not be read, --output among them: the command
		// line says whether its caller reads JSON.
		if cmd.Name() == "run" && asksForJSON(a.args) {
			a.printJSONError(e)
		}
		return e
	})
	root.CompletionOptions.DisableDefaultCmd = true
	// Each command defines only the flags it uses, so that its --help
	// lists those and an unknown one is caught and explained.
	root.AddCommand(a.migrateCmd(), a.runCmd(), a.inspectCmd(), a.requeueCmd(), a.cancelCmd(), a.pruneCmd(), a.releaseHoldCmd(), a.suggestLimitsCmd(), a.demoCmd(), a.versionCmd())
	return root
}

// asksForJSON reports whether args hold --once and --output json (or
// --output=json), the only command line whose stdout is JSON.
func asksForJSON(args []string) bool {
	once, json := false, false
	for i, arg := range args {
		once = once || arg == "--once" || arg == "--once=true"
		json = json || arg == "--output=json" || arg == "--output" && i+1 < len(args) && args[i+1] == outputJSON
	}
	return once && json
}

// oneLine folds a message onto one line for stderr, dropping repeated
// lines (pgx reports each connection attempt, often the same twice).
func oneLine(s string) string {
	var lines []string
	for _, l := range strings.Split(s, "\n") {
		if l = strings.TrimSpace(l); l != "" && !slices.Contains(lines, l) {
			lines = append(lines, l)
		}
	}
	return strings.ReplaceAll(strings.Join(lines, "; "), ":; ", ": ")
}
