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
from, and the Go version. They come from the linker flags of ` + "`make build`" + ` and
the image (git describe), else from Go's build information; a binary built
with neither (go run, go test) prints "devel".`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			_, err := fmt.Fprintf(a.stdout, "jobreaper %s\n", version())
			return err
		},
	}
}

// buildVersion and buildRevision are set by the linker where Go's VCS
// stamping cannot see the repository (a Docker build context without
// .git, a source tarball): `make build` and deploy/Dockerfile pass
//
//	-ldflags "-X main.buildVersion=$(git describe --tags --always --dirty) -X main.buildRevision=$(git rev-parse HEAD)"
//
// Empty (the default) means "not stamped": the build information decides.
var (
	buildVersion  string
	buildRevision string
)

// version describes the running binary: see stampedVersion.
func version() string {
	bi, _ := debug.ReadBuildInfo()
	return stampedVersion(bi, buildVersion, buildRevision, runtime.Version())
}

// versionOf is stampedVersion without linker stamps.
func versionOf(bi *debug.BuildInfo, goVersion string) string {
	return stampedVersion(bi, "", "", goVersion)
}

// stampedVersion returns "<version>, revision <revision>[ (modified)],
// <go version>". The version is linkVersion when set (git describe's
// answer names the tag, the commits since and the dirty state), else the
// module version of bi, else "devel" (go run, go test, a build outside
// version control without linker flags). The revision is bi's
// vcs.revision when recorded, else linkRevision; the revision part is
// left out when neither has one. bi is nil when the binary has no build
// information.
func stampedVersion(bi *debug.BuildInfo, linkVersion, linkRevision, goVersion string) string {
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
	if linkVersion != "" {
		v = linkVersion
	}
	if revision == "" {
		revision = linkRevision
	}
	if revision != "" {
		v += ", revision " + revision
		if modified {
			v += " (modified)"
		}
	}
	return v + ", " + goVersion
}
