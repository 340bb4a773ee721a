package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/jobreaper/jobreaper/reaper"
)

// repoRoot is the repository's root, from this package's directory.
func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// readmeSection returns the text of README.md's section whose heading is
// heading ("## Metrics"), up to the next heading of the same level.
func readmeSection(t *testing.T, heading string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot(t), "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	text := string(b)
	start := strings.Index(text, "\n"+heading+"\n")
	if start < 0 {
		t.Fatalf("README.md has no %q section", heading)
	}
	section := text[start+1+len(heading):]
	level := heading[:strings.IndexByte(heading, ' ')+1] // "## "
	if end := strings.Index(section, "\n"+level); end >= 0 {
		section = section[:end]
	}
	return section
}

// The Go code of README's "Wiring the worker side" must compile against
// the repository's packages: it is written into a module of its own that
// requires the repository through a replace directive and the repository's
// own requirements, and go vet runs on it. Nothing is downloaded
// (GOPROXY=off): the modules come from the module cache the repository's
// own build filled.
func TestREADMEWorkerSnippetCompiles(t *testing.T) {
	t.Parallel()
	section := readmeSection(t, "## Wiring the worker side")
	start := strings.Index(section, "```go\n")
	if start < 0 {
		t.Fatal(`README's "Wiring the worker side" has no Go code block`)
	}
	code := section[start+len("```go\n"):]
	end := strings.Index(code, "\n```")
	if end < 0 {
		t.Fatal("the Go code block is not closed")
	}
	code = code[:end+1]
	// A complete program (package main with its func main) compiles as
	// written; a fragment starting with its imports gets a package clause.
	program := strings.HasPrefix(code, "package main\n")
	if !program && !strings.HasPrefix(code, "import (") {
		t.Fatalf("the snippet should start with its package clause or its imports, got %q", code[:min(40, len(code))])
	}
	if program && !strings.Contains(code, "\nfunc main() {") {
		t.Fatal("the snippet is package main without a func main")
	}
	source := "package readmesnippet\n\n" + code
	if program {
		source = code
	}

	root := repoRoot(t)
	goMod, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	goSum, err := os.ReadFile(filepath.Join(root, "go.sum"))
	if err != nil {
		t.Fatal(err)
	}
	// The repository's go.mod with another module path: its go version and
	// every requirement (so the module graph needs nothing new), plus the
	// repository itself, replaced by this checkout.
	mod := regexp.MustCompile(`(?m)^module .*$`).ReplaceAllString(string(goMod), "module example.com/readmesnippet")
	mod += "\nrequire github.com/jobreaper/jobreaper v0.0.0\n\nreplace github.com/jobreaper/jobreaper => " + root + "\n"

	dir := t.TempDir()
	for name, content := range map[string]string{
		"go.mod":     mod,
		"go.sum":     string(goSum),
		"snippet.go": source,
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	goBin, err := exec.LookPath("go") // go test puts its own go first on PATH
	if err != nil {
		t.Fatalf("the go command is not on PATH: %v", err)
	}
	cmd := exec.CommandContext(t.Context(), goBin, "vet", "./...")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "GOPROXY=off", "GOWORK=off", "GOTOOLCHAIN=local")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("README's worker snippet does not vet (%v):\n%s\nthe snippet as compiled:\n%s", err, out.String(), code)
	}
}

// README's metrics table names exactly the series the reaper exports.
func TestREADMEMetricsTableMatchesTheReaper(t *testing.T) {
	t.Parallel()
	rec := &descRecorder{}
	reaper.NewMetrics(rec)
	var exported []string
	for _, name := range rec.names {
		if !strings.HasSuffix(name, "_bucket") && !strings.HasSuffix(name, "_sum") && !strings.HasSuffix(name, "_count") {
			exported = append(exported, name)
		}
	}
	var documented []string
	for _, m := range regexp.MustCompile("(?m)^\\| `(jobreaper_[a-z_]+)` \\|").FindAllStringSubmatch(readmeSection(t, "## Metrics"), -1) {
		documented = append(documented, m[1])
	}
	slices.Sort(exported)
	slices.Sort(documented)
	if !slices.Equal(exported, documented) {
		t.Fatalf("README documents metrics\n%v\nthe reaper exports\n%v", documented, exported)
	}
}
