package main

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/jobreaper/jobreaper/jobs/jobstest"
)

// kubernetesConfig returns the jobreaper.yaml of the Kubernetes example's
// ConfigMap, after checking that every document of the manifest parses.
func kubernetesConfig(t *testing.T) string {
	t.Helper()
	raw, err := os.ReadFile("../../deploy/kubernetes-sidecar.yaml")
	if err != nil {
		t.Fatal(err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(raw))
	var embedded string
	kinds := 0
	for {
		var doc struct {
			Kind string            `yaml:"kind"`
			Data map[string]string `yaml:"data"`
		}
		if err := dec.Decode(&doc); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("parsing the Kubernetes manifest: %v", err)
		}
		kinds++
		if doc.Kind == "ConfigMap" {
			embedded = doc.Data["jobreaper.yaml"]
		}
	}
	if embedded == "" || kinds < 2 {
		t.Fatalf("the manifest has %d documents and no ConfigMap with jobreaper.yaml", kinds)
	}
	return embedded
}

// The shipped configurations work as shipped: given only what a deploy
// gives them besides the file (the database and Redis URLs, the schema),
// one pass runs against a freshly migrated database and exits 0.
func TestShippedConfigsRunOnce(t *testing.T) {
	t.Parallel()
	files := map[string]string{"example": "../../deploy/jobreaper.example.yaml"}
	k8s := filepath.Join(t.TempDir(), "configmap.yaml")
	if err := os.WriteFile(k8s, []byte(kubernetesConfig(t)), 0o600); err != nil {
		t.Fatal(err)
	}
	files["kubernetes"] = k8s
	for name, file := range files {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			db := jobstest.New(t)
			r := run(t, "run", "--once", "--config", file, "--database-url", db.URL, "--schema", db.Schema,
				"--redis-url", redisTestURL(), "--metrics-addr", "off", "--output", "json")
			requireExit(t, r, exitOK)
			doc := requireOneJSONResult(t, r.stdout)
			if string(doc["errors"]) != "0" {
				t.Fatalf("the pass counted errors: %s", r.stdout)
			}
		})
	}
}

// The systemd unit names paths (its binary, environment file, config,
// documentation) that its own install steps, in the unit's header, create.
// The steps run here under a temporary root; `make build` is replaced by
// a stand-in binary and systemctl is not run.
func TestSystemdUnitPathsExistAfterItsInstallSteps(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile("../../deploy/jobreaper.service")
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	repo := filepath.Join(root, "repo")
	docs, err := filepath.Glob("../../docs/*.md")
	if err != nil || len(docs) == 0 {
		t.Fatalf("no docs/*.md to install (%v)", err)
	}
	shipped := []string{"bin/jobreaper", "deploy/jobreaper.service", "deploy/jobreaper.example.yaml", "README.md"}
	for _, d := range docs {
		shipped = append(shipped, "docs/"+filepath.Base(d))
	}
	for _, f := range shipped {
		src := filepath.Join("../..", f)
		if f == "bin/jobreaper" {
			src = "../../deploy/jobreaper.service" // any file: the binary is not run
		}
		data, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(filepath.Dir(filepath.Join(repo, f)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(repo, f), data, 0o755); err != nil {
			t.Fatal(err)
		}
	}

	// The header's install block: comment lines after "# Install:".
	var steps []string
	inInstall := false
	sc := bufio.NewScanner(bytes.NewReader(raw))
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "# Install:"):
			inInstall = true
		case inInstall && strings.HasPrefix(line, "#   "):
			step := strings.TrimPrefix(line, "#   ")
			if strings.HasPrefix(step, "make build") || strings.HasPrefix(step, "systemctl") {
				continue
			}
			step, _, _ = strings.Cut(step, "   #") // a trailing comment
			// Every absolute path lands under the temporary root.
			step = regexp.MustCompile(`(^|[\s>])/`).ReplaceAllString(step, "${1}"+root+"/")
			steps = append(steps, step)
		case inInstall:
			inInstall = false
		}
	}
	if len(steps) < 4 {
		t.Fatalf("found %d install steps in the unit's header: %q", len(steps), steps)
	}
	cmd := exec.Command("sh", "-ec", strings.Join(steps, "\n"))
	cmd.Dir = repo
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("install steps failed: %v\n%s\nsteps:\n%s", err, out, strings.Join(steps, "\n"))
	}

	// Every absolute path the unit's directives name.
	paths := map[string]bool{}
	for _, line := range strings.Split(string(raw), "\n") {
		if strings.HasPrefix(line, "#") || !strings.Contains(line, "=") {
			continue
		}
		key, value, _ := strings.Cut(line, "=")
		switch key {
		case "ExecStart", "ExecStartPre", "EnvironmentFile", "Documentation", "Environment":
			for _, p := range regexp.MustCompile(`(?:file://)?(/[^\s]+)`).FindAllStringSubmatch(value, -1) {
				paths[p[1]] = true
			}
		}
	}
	for _, want := range []string{"/usr/local/bin/jobreaper", "/etc/jobreaper/env", "/etc/jobreaper/jobreaper.yaml"} {
		if !paths[want] {
			t.Errorf("the unit no longer names %s; found %v", want, paths)
		}
	}
	for p := range paths {
		if _, err := os.Stat(filepath.Join(root, p)); err != nil {
			t.Errorf("the unit names %s, which its install steps do not create: %v", p, err)
		}
	}
	if fi, err := os.Stat(filepath.Join(root, "etc/jobreaper/env")); err == nil && fi.Mode().Perm() != 0o600 {
		t.Errorf("the environment file holds secrets and has mode %v, want 0600", fi.Mode().Perm())
	}
}

// k8sEnv is one env entry of a container of the Kubernetes example.
type k8sEnv struct {
	Name      string `yaml:"name"`
	Value     string `yaml:"value"`
	ValueFrom *struct {
		SecretKeyRef *struct {
			Name string `yaml:"name"`
			Key  string `yaml:"key"`
		} `yaml:"secretKeyRef"`
	} `yaml:"valueFrom"`
}

// Every container of the Kubernetes example that loads jobreaper's
// settings (JOBREAPER_CONFIG) gets the database and Redis URLs from the
// same Secret keys as the daemon: a worker built from docs/worker.md's
// program loads them with config.Load, and without them stops at start
// with "database_url is required".
func TestKubernetesContainersThatLoadTheConfigGetTheDaemonsSecrets(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile("../../deploy/kubernetes-sidecar.yaml")
	if err != nil {
		t.Fatal(err)
	}
	type container struct {
		Name string   `yaml:"name"`
		Env  []k8sEnv `yaml:"env"`
	}
	var containers []container
	dec := yaml.NewDecoder(bytes.NewReader(raw))
	for {
		var doc struct {
			Kind string `yaml:"kind"`
			Spec struct {
				Template struct {
					Spec struct {
						InitContainers []container `yaml:"initContainers"`
						Containers     []container `yaml:"containers"`
					} `yaml:"spec"`
				} `yaml:"template"`
			} `yaml:"spec"`
		}
		if err := dec.Decode(&doc); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		if doc.Kind == "Deployment" {
			containers = append(append(containers, doc.Spec.Template.Spec.InitContainers...), doc.Spec.Template.Spec.Containers...)
		}
	}
	secrets := func(c container) map[string]string {
		out := map[string]string{}
		for _, e := range c.Env {
			if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
				out[e.Name] = e.ValueFrom.SecretKeyRef.Name + "/" + e.ValueFrom.SecretKeyRef.Key
			}
		}
		return out
	}
	var daemon map[string]string
	for _, c := range containers {
		if c.Name == "jobreaper" {
			daemon = secrets(c)
		}
	}
	if daemon["JOBREAPER_DATABASE_URL"] == "" || daemon["JOBREAPER_REDIS_URL"] == "" {
		t.Fatalf("the daemon container's secret references = %v, want the database and Redis URLs", daemon)
	}
	loaders := 0
	for _, c := range containers {
		if !slices.ContainsFunc(c.Env, func(e k8sEnv) bool { return e.Name == "JOBREAPER_CONFIG" }) {
			continue
		}
		loaders++
		got := secrets(c)
		for _, name := range []string{"JOBREAPER_DATABASE_URL", "JOBREAPER_REDIS_URL"} {
			if got[name] != daemon[name] {
				t.Errorf("container %s: %s comes from %q, the daemon's from %q", c.Name, name, got[name], daemon[name])
			}
		}
	}
	if loaders < 3 {
		t.Fatalf("%d containers load JOBREAPER_CONFIG, want the migrate init container, the worker and the daemon", loaders)
	}
}
