package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime/debug"
	"strings"
	"testing"
)

func TestStampedVersion(t *testing.T) {
	t.Parallel()
	vcs := &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}, Settings: []debug.BuildSetting{
		{Key: "vcs.revision", Value: "0123abcd"}, {Key: "vcs.modified", Value: "true"}}}
	for _, tt := range []struct {
		name             string
		bi               *debug.BuildInfo
		linkVer, linkRev string
		want             string
	}{
		{"NothingStamped", nil, "", "", "devel, go1.26.0"},
		{"LinkerOnly", &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}}, "v0.4.0-2-g89ab", "89abcdef", "v0.4.0-2-g89ab, revision 89abcdef, go1.26.0"},
		{"LinkerVersionWithVCSRevision", vcs, "v0.4.0-dirty", "ffff", "v0.4.0-dirty, revision 0123abcd (modified), go1.26.0"},
		{"VCSOnly", vcs, "", "", "devel, revision 0123abcd (modified), go1.26.0"},
	} {
		if got := stampedVersion(tt.bi, tt.linkVer, tt.linkRev, "go1.26.0"); got != tt.want {
			t.Errorf("%s: stampedVersion = %q, want %q", tt.name, got, tt.want)
		}
	}
}

// `make build` stamps the version through linker flags, so a binary built
// where Go's VCS stamping is off (-buildvcs=false, as in the image, whose
// build context has no .git) still names it. The test builds with the
// very command make prints.
func TestMakeBuildStampsTheVersionWithoutVCSStamping(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("make"); err != nil {
		t.Fatal("make is not installed: apt-get install -y make")
	}
	repo, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	// Without overrides the version is git describe's answer.
	describe, err := exec.Command("git", "-C", repo, "describe", "--tags", "--always", "--dirty").Output()
	if err != nil {
		t.Fatalf("git describe: %v", err)
	}
	dry, err := exec.Command("make", "-s", "-C", repo, "-n", "build").Output()
	if err != nil {
		t.Fatalf("make -n build: %v", err)
	}
	if want := "-X main.buildVersion=" + strings.TrimSpace(string(describe)) + " "; !strings.Contains(string(dry), want) {
		t.Fatalf("make build runs %q, want it to contain %q", dry, want)
	}

	dry, err = exec.Command("make", "-s", "-C", repo, "-n", "build", "VERSION=v9.8.7-3-gabcdef1", "REVISION=abcdef1234").Output()
	if err != nil {
		t.Fatalf("make -n build: %v", err)
	}
	line := strings.TrimSpace(string(dry))
	bin := filepath.Join(t.TempDir(), "jobreaper")
	if !strings.Contains(line, " build ") || !strings.Contains(line, "-o bin/jobreaper") {
		t.Fatalf("unexpected build command %q", line)
	}
	line = strings.Replace(line, " build ", " build -buildvcs=false ", 1)
	line = strings.Replace(line, "-o bin/jobreaper", "-o "+bin, 1)
	build := exec.Command("sh", "-c", line)
	build.Dir = repo
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", line, err, out)
	}
	out, err := exec.Command(bin, "version").Output()
	if err != nil {
		t.Fatalf("jobreaper version: %v", err)
	}
	if !regexp.MustCompile(`^jobreaper v9\.8\.7-3-gabcdef1, revision abcdef1234, go\S+\n$`).Match(out) {
		t.Fatalf("jobreaper version printed %q, want the stamped version and revision", out)
	}
}

// The image passes the same linker flags from its build arguments, and
// make docker passes git describe's answer as those arguments.
func TestDockerfileStampsTheVersionFromBuildArguments(t *testing.T) {
	t.Parallel()
	docker, err := os.ReadFile("../../deploy/Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	makefile, err := os.ReadFile("../../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"ARG VERSION", "ARG REVISION", "-X main.buildVersion=${VERSION}", "-X main.buildRevision=${REVISION}"} {
		if !strings.Contains(string(docker), want) {
			t.Errorf("deploy/Dockerfile lacks %q", want)
		}
	}
	for _, want := range []string{"--build-arg VERSION=$(VERSION)", "--build-arg REVISION=$(REVISION)"} {
		if !strings.Contains(string(makefile), want) {
			t.Errorf("Makefile's docker target lacks %q", want)
		}
	}
}
