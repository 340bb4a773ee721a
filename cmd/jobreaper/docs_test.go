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

// docSection returns the text of the section of page (a path from the
// repository's root: "README.md", "docs/metrics.md") whose heading is
// heading ("## The daemon's metrics"), up to the next heading of the same
// level.
func docSection(t *testing.T, page, heading string) string {
	t.Helper()
	text := readDoc(t, page)
	start := strings.Index(text, "\n"+heading+"\n")
	if start < 0 {
		t.Fatalf("%s has no %q section", page, heading)
	}
	section := text[start+1+len(heading):]
	level := heading[:strings.IndexByte(heading, ' ')+1] // "## "
	if end := strings.Index(section, "\n"+level); end >= 0 {
		section = section[:end]
	}
	return section
}

// workerPrograms are the worker programs the docs show: README's minimal
// one and docs/worker.md's complete one, each the first Go code block of
// its section.
var workerPrograms = []struct{ page, heading, dir string }{
	{"README.md", "## A minimal worker", "readme"},
	{"docs/worker.md", "## Wiring the worker side", "worker"},
}

// goBlock returns the first Go code block of a section, with its final
// newline.
func goBlock(t *testing.T, page, heading string) string {
	t.Helper()
	section := docSection(t, page, heading)
	start := strings.Index(section, "```go\n")
	if start < 0 {
		t.Fatalf("%s's %q has no Go code block", page, heading)
	}
	code := section[start+len("```go\n"):]
	end := strings.Index(code, "\n```")
	if end < 0 {
		t.Fatalf("the Go code block of %s's %q is not closed", page, heading)
	}
	return code[:end+1]
}

// The worker programs of README and docs/worker.md must compile against
// the repository's packages: each is written as a package of a module of
// its own that requires the repository through a replace directive and the
// repository's own requirements, and go vet runs on them. Nothing is
// downloaded (GOPROXY=off): the modules come from the module cache the
// repository's own build filled.
func TestREADMEAndWorkerDocProgramsCompile(t *testing.T) {
	t.Parallel()
	sources := map[string]string{}
	for _, p := range workerPrograms {
		code := goBlock(t, p.page, p.heading)
		if !strings.HasPrefix(code, "package main\n") || !strings.Contains(code, "\nfunc main() {") {
			t.Fatalf("%s's %q should show a whole program (package main with its func main), got %q", p.page, p.heading, code[:min(40, len(code))])
		}
		sources[p.dir] = code
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
	mod := regexp.MustCompile(`(?m)^module .*$`).ReplaceAllString(string(goMod), "module example.com/docsprograms")
	mod += "\nrequire github.com/jobreaper/jobreaper v0.0.0\n\nreplace github.com/jobreaper/jobreaper => " + root + "\n"

	dir := t.TempDir()
	files := map[string]string{"go.mod": mod, "go.sum": string(goSum)}
	for sub, code := range sources {
		files[filepath.Join(sub, "main.go")] = code
	}
	for name, content := range files {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, name)), 0o755); err != nil {
			t.Fatal(err)
		}
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
		t.Fatalf("the docs' worker programs do not vet (%v):\n%s\n(readme/ is README.md's %q, worker/ is docs/worker.md's %q)",
			err, out.String(), workerPrograms[0].heading, workerPrograms[1].heading)
	}
}

// docs/metrics.md's table of the daemon's metrics names exactly the series
// the reaper exports.
func TestDocsMetricsTableMatchesTheReaper(t *testing.T) {
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
	for _, m := range regexp.MustCompile("(?m)^\\| `(jobreaper_[a-z_]+)` \\|").FindAllStringSubmatch(docSection(t, "docs/metrics.md", "## The daemon's metrics"), -1) {
		documented = append(documented, m[1])
	}
	slices.Sort(exported)
	slices.Sort(documented)
	if !slices.Equal(exported, documented) {
		t.Fatalf("docs/metrics.md documents metrics\n%v\nthe reaper exports\n%v", documented, exported)
	}
}

// The uninstall steps of docs/operating.md drop every table and function
// the migrations create, so a user who follows them leaves nothing behind.
func TestUninstallDropsEveryObjectTheMigrationsCreate(t *testing.T) {
	t.Parallel()
	files, err := filepath.Glob(filepath.Join(repoRoot(t), "jobs", "migrations", "*.sql"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no migrations found: %v", err)
	}
	created := regexp.MustCompile(`(?m)^\s*CREATE (?:OR REPLACE )?(TABLE|FUNCTION) (?:IF NOT EXISTS )?([a-z_]+)`)
	page := readDoc(t, "docs/operating.md")
	start := strings.Index(page, "DROP TABLE jobs,")
	if start < 0 {
		t.Fatal("docs/operating.md has no DROP TABLE list of the uninstall steps")
	}
	end := strings.Index(page[start:], "```")
	drops := page[start : start+end]
	var missing []string
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range created.FindAllStringSubmatch(string(b), -1) {
			if !regexp.MustCompile(`\b` + m[2] + `\b`).MatchString(drops) {
				missing = append(missing, m[1]+" "+m[2]+" ("+filepath.Base(f)+")")
			}
		}
	}
	if len(missing) > 0 {
		t.Fatalf("the uninstall steps of docs/operating.md do not drop: %s", strings.Join(missing, ", "))
	}
}

// The docs' example messages name the schema version this binary ships:
// the number of its latest migration.
func TestDocsNameTheShippedSchemaVersion(t *testing.T) {
	t.Parallel()
	files, err := filepath.Glob(filepath.Join(repoRoot(t), "jobs", "migrations", "*.sql"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no migrations found: %v", err)
	}
	slices.Sort(files)
	latest := strings.TrimLeft(strings.SplitN(filepath.Base(files[len(files)-1]), "_", 2)[0], "0")
	for _, page := range []string{"README.md", "docs/schema.md", "docs/operating.md"} {
		for _, m := range regexp.MustCompile(`ships version ([0-9]+)`).FindAllStringSubmatch(readDoc(t, page), -1) {
			if m[1] != latest {
				t.Errorf("%s says %q; the latest migration is %s", page, m[0], latest)
			}
		}
	}
}
