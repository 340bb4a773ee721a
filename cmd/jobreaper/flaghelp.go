package main

import (
	"fmt"
	"slices"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/jobreaper/jobreaper/config"
)

// flagProblem words a flag parsing error of cmd for a new user: an unknown
// flag that another command has says which command it belongs to
// ("--once belongs to jobreaper run"); another unknown flag gets the
// closest flag cmd has ("did you mean --stall-timeout?"). Other errors (a
// malformed value) are returned as they are.
func flagProblem(cmd *cobra.Command, err error) string {
	msg := err.Error()
	name, ok := strings.CutPrefix(msg, "unknown flag: --")
	if !ok {
		return msg
	}
	if owners := flagOwners(cmd.Root(), name); len(owners) > 0 && cmd.Flags().Lookup(name) == nil {
		if len(owners) > 1 {
			// Several commands have it: none is the one meant (suggesting
			// the first could send a reader to a command that writes).
			return fmt.Sprintf("%s; --%s belongs to %s, not to %s", msg, name, strings.Join(owners, " and "), cmd.CommandPath())
		}
		return fmt.Sprintf("%s; --%s belongs to %s, not to %s (write: %s --%s)", msg, name, owners[0],
			cmd.CommandPath(), owners[0], name)
	}
	if near := closestFlag(cmd.Flags(), name); near != "" {
		return fmt.Sprintf("%s; did you mean --%s?", msg, near)
	}
	return msg
}

// flagOwners returns the command paths of root's subcommands that define
// the flag name, sorted.
func flagOwners(root *cobra.Command, name string) []string {
	var owners []string
	for _, sub := range root.Commands() {
		if sub.Flags().Lookup(name) != nil {
			owners = append(owners, sub.CommandPath())
		}
	}
	slices.Sort(owners)
	return owners
}

// closestFlag returns the flag of fs nearest to name by edit distance when
// it is close enough to be a typo, else "".
func closestFlag(fs *pflag.FlagSet, name string) string {
	best, bestD := "", len(name)/2+2
	fs.VisitAll(func(f *pflag.Flag) {
		if f.Hidden {
			return
		}
		if d := config.EditDistance(name, f.Name); d < bestD || (d == bestD && f.Name < best) {
			best, bestD = f.Name, d
		}
	})
	return best
}

// hoistLeadingFlags moves flags written before the command name after it
// ("jobreaper --schema jr run" runs as "jobreaper run --schema jr"): each
// command defines its own flags, and people write the settings first. A
// flag's arity is looked up in the commands that define it; an argument
// list without a command name is returned as it is.
func hoistLeadingFlags(root *cobra.Command, args []string) []string {
	i := 0
	for i < len(args) && strings.HasPrefix(args[i], "-") && args[i] != "--" {
		name, hasValue := strings.CutPrefix(args[i], "--")
		if !hasValue {
			return args // a shorthand such as -h: root's own
		}
		i++
		if strings.Contains(name, "=") {
			continue
		}
		if f := anyFlag(root, name); f != nil && f.NoOptDefVal == "" {
			i++ // the flag's value
		}
	}
	if i == 0 || i >= len(args) {
		return args
	}
	sub, _, err := root.Find(args[i : i+1])
	if err != nil || sub == root {
		return args
	}
	out := append([]string{args[i]}, args[:i]...)
	return append(out, args[i+1:]...)
}

// anyFlag returns the flag name of the first of root's subcommands that
// defines it, or nil.
func anyFlag(root *cobra.Command, name string) *pflag.Flag {
	for _, sub := range root.Commands() {
		if f := sub.Flags().Lookup(name); f != nil {
			return f
		}
	}
	return nil
}
