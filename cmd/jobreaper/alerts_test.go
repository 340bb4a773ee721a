package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// alertsFile is the shipped Prometheus rules file.
const alertsFile = "../../deploy/prometheus/alerts.yaml"

// readmeAnchors returns the GitHub anchor of every heading of README.md.
func readmeAnchors(t *testing.T) map[string]bool {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot(t), "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	drop := regexp.MustCompile(`[^a-z0-9 _-]`)
	anchors := map[string]bool{}
	inCode := false
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "```") {
			inCode = !inCode
		}
		if inCode || !strings.HasPrefix(line, "#") {
			continue
		}
		title := strings.TrimSpace(strings.TrimLeft(line, "#"))
		anchors[strings.ReplaceAll(drop.ReplaceAllString(strings.ToLower(title), ""), " ", "-")] = true
	}
	return anchors
}

// The alerting rules README suggests are shipped as a rules file: each
// expression selects only metrics the daemon or the worker library
// exports, each alert has a severity, a summary and a runbook pointing at
// a README section that exists. promtool, where installed (.ci/test
// installs Debian's prometheus package), checks the file's syntax too.
func TestPrometheusAlertsQueryExportedMetricsAndPointAtTheREADME(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile(alertsFile)
	if err != nil {
		t.Fatal(err)
	}
	var file struct {
		Groups []struct {
			Name  string `yaml:"name"`
			Rules []struct {
				Alert       string            `yaml:"alert"`
				Expr        string            `yaml:"expr"`
				For         string            `yaml:"for"`
				Labels      map[string]string `yaml:"labels"`
				Annotations map[string]string `yaml:"annotations"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	dec := yaml.NewDecoder(strings.NewReader(string(raw)))
	dec.KnownFields(true)
	if err := dec.Decode(&file); err != nil {
		t.Fatalf("parsing %s: %v", alertsFile, err)
	}
	exported := exportedMetrics(t)
	anchors := readmeAnchors(t)
	runbook := regexp.MustCompile(`^https://github\.com/jobreaper/jobreaper/blob/main/README\.md#([a-z0-9_-]+)$`)
	alerts := map[string]bool{}
	for _, g := range file.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" || alerts[r.Alert] {
				t.Errorf("group %s: a rule without an alert name, or %q twice", g.Name, r.Alert)
			}
			alerts[r.Alert] = true
			names := promqlMetricNames(r.Expr)
			if len(names) == 0 {
				t.Errorf("%s: %q selects no metric", r.Alert, r.Expr)
			}
			for _, name := range names {
				if !exported[name] {
					t.Errorf("%s: %q selects %s, which neither the daemon nor the worker library exports", r.Alert, r.Expr, name)
				}
			}
			if r.Labels["severity"] == "" || r.Annotations["summary"] == "" || r.Annotations["description"] == "" {
				t.Errorf("%s: want a severity label, a summary and a description", r.Alert)
			}
			m := runbook.FindStringSubmatch(r.Annotations["runbook"])
			switch {
			case m == nil:
				t.Errorf("%s: runbook %q is not a link to a README section", r.Alert, r.Annotations["runbook"])
			case !anchors[m[1]]:
				t.Errorf("%s: runbook %q names no README heading", r.Alert, r.Annotations["runbook"])
			}
		}
	}
	for _, want := range []string{"JobreaperNoCleanPass", "JobreaperNoLeader", "JobreaperSettingsDrift", "JobreaperLostLimitTripped",
		"JobreaperRedisEvictionUnsafe", "JobreaperMarkersFailing", "JobreaperStaleQueuedJobs"} {
		if !alerts[want] {
			t.Errorf("the rules file lacks %s", want)
		}
	}

	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Log("promtool is not on PATH (bash .ci/test fetches it): the rules' syntax is checked there")
		return
	}
	out, err := exec.CommandContext(t.Context(), promtool, "check", "rules", alertsFile).CombinedOutput()
	if err != nil {
		t.Fatalf("promtool check rules %s: %v\n%s", alertsFile, err, out)
	}
}
