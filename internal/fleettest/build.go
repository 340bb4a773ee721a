package fleettest

import (
	"os/exec"
	"path/filepath"
	"testing"
)

// Packages the harness builds.
const (
	jobreaperPkg = "github.com/jobreaper/jobreaper/cmd/jobreaper"
	workerPkg    = "github.com/jobreaper/jobreaper/internal/fleettest/worker"
)

// BuildJobreaper builds the jobreaper command with the failpoints tag
// into t's temporary directory and returns the binary's path: a daemon
// started with Failpoints set takes the actions it names (package
// internal/failpoint); without it the binary behaves as a release build.
func BuildJobreaper(t testing.TB) string {
	t.Helper()
	return build(t, jobreaperPkg, "jobreaper", "failpoints")
}

// BuildJobreaperBroken builds the jobreaper command with the failpoints
// tag and tag, one of package internal/broken's test-only tags
// (brokenfence, brokengrace, brokenstorm, brokenhbretry): a daemon with one
// safety mechanism off, for the tests that show a scenario fails without
// it.
func BuildJobreaperBroken(t testing.TB, tag string) string {
	t.Helper()
	return build(t, jobreaperPkg, "jobreaper-"+tag, "failpoints,"+tag)
}

// BuildWorkerBroken builds the worker program with tag (see
// BuildJobreaperBroken): brokenhbretry turns its Heartbeater's retry off.
func BuildWorkerBroken(t testing.TB, tag string) string {
	t.Helper()
	return build(t, workerPkg, "worker-"+tag, tag)
}

// BuildJobreaperRelease builds the jobreaper command as a release is built
// (no build tag), for tests and benchmarks that need exactly what ships.
func BuildJobreaperRelease(t testing.TB) string {
	t.Helper()
	return build(t, jobreaperPkg, "jobreaper-release", "")
}

// BuildWorker builds the worker program (package internal/fleettest/worker).
func BuildWorker(t testing.TB) string {
	t.Helper()
	return build(t, workerPkg, "worker", "")
}

// build runs go build of pkg with tags into t's temporary directory. It
// fails t when the go command is not on PATH (go test puts its own first)
// or the build fails. Go's build cache makes a second build of the same
// package a link only.
func build(t testing.TB, pkg, name, tags string) string {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command is not on PATH: %v", err)
	}
	bin := filepath.Join(t.TempDir(), name)
	args := []string{"build", "-o", bin}
	if tags != "" {
		args = append(args, "-tags", tags)
	}
	cmd := exec.CommandContext(t.Context(), goBin, append(args, pkg)...)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building %s (tags %q): %v\n%s", pkg, tags, err, out)
	}
	return bin
}
