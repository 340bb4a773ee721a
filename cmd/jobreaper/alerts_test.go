package main

import (
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// alertsFile is the shipped Prometheus rules file.
const alertsFile = "../../deploy/prometheus/alerts.yaml"

// The alerting rules docs/operating.md suggests are shipped as a rules
// file: each expression selects only metrics the daemon or the worker
// library exports, each alert has a severity, a summary and a runbook
// pointing at a section of a docs page that exists (GitHub's anchors, as
// the link test reads them). promtool, where installed (.ci/test fetches
// it), checks the file's syntax too.
func TestPrometheusAlertsQueryExportedMetricsAndPointAtTheDocs(t *testing.T) {
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
	runbook := regexp.MustCompile(`^https://github\.com/jobreaper/jobreaper/blob/main/(docs/[a-z]+\.md)#([a-z0-9_-]+)$`)
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
				t.Errorf("%s: runbook %q is not a link to a section of a page of docs/", r.Alert, r.Annotations["runbook"])
			case !markdownAnchors(readDoc(t, m[1]))[m[2]]:
				t.Errorf("%s: runbook %q names no heading of %s", r.Alert, r.Annotations["runbook"], m[1])
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
