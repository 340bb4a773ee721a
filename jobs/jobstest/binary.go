package jobstest

import (
	"os/exec"
	"path/filepath"
	"testing"
)

// BuildJobreaper builds the jobreaper command (github.com/jobreaper/jobreaper/cmd/jobreaper)
// into t's temporary directory and returns the binary's path, for tests
// and benchmarks that run the real process. It fails t when the go command
// is not on PATH (go test puts its own first) or the build fails.
func BuildJobreaper(t testing.TB) string {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command is not on PATH: %v", err)
	}
	bin := filepath.Join(t.TempDir(), "jobreaper")
	cmd := exec.CommandContext(t.Context(), goBin, "build", "-o", bin, "github.com/jobreaper/jobreaper/cmd/jobreaper")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building jobreaper: %v\n%s", err, out)
	}
	return bin
}
