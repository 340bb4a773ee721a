package main

import (
	"fmt"
	"runtime"
	"runtime/debug"

	"github.com/spf13/cobra"
)

// versionCmd prints what version() returns; `jobreaper --version` prints
// the same line.
func (a *app) versionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print jobreaper's version, VCS revision and Go version",
		Long: `version prints the module version and VCS revision the binary was built
from (from its build information), and the Go version. A binary built
without that information (go run, go test) prints "devel".`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			_, err := fmt.Fprintf(a.stdout, "jobreaper %s\n", version())
			return err
		},
	}
}

// version describes the running binary: see versionOf.
func version() string {
	bi, _ := debug.ReadBuildInfo()
	return versionOf(bi, runtime.Version())
}

// versionOf returns "<module version>, revision <vcs.revision>[ (modified)],
// <go version>" from bi (nil when the binary has no build information).
// The module version is "devel" when bi has none (go run, go test, or a
// build outside version control); the revision part is left out when bi
// records none.
func versionOf(bi *debug.BuildInfo, goVersion string) string {
	v, revision, modified := "devel", "", false
	if bi != nil {
		if bi.Main.Version != "" && bi.Main.Version != "(devel)" {
			v = bi.Main.Version
		}
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				revision = s.Value
			case "vcs.modified":
				modified = s.Value == "true"
			}
		}
	}
	if revision != "" {
		v += ", revision " + revision
		if modified {
			v += " (modified)"
		}
	}
	return v + ", " + goVersion
}
