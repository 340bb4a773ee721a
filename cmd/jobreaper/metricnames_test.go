package main

import (
	"encoding/json"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/queue"
	"github.com/jobreaper/jobreaper/reaper"
)

// recordingRegistry is a fresh prometheus.Registry that also records the
// name of every metric registered with it, labelled or not: a vector with
// no series yet is missing from Gather, but a query may name it.
type recordingRegistry struct {
	*prometheus.Registry
	names map[string]bool
}

func newRecordingRegistry() *recordingRegistry {
	return &recordingRegistry{Registry: prometheus.NewRegistry(), names: map[string]bool{}}
}

func (r *recordingRegistry) Register(c prometheus.Collector) error {
	ch := make(chan *prometheus.Desc)
	go func() { c.Describe(ch); close(ch) }()
	for desc := range ch {
		if m := fqName.FindStringSubmatch(desc.String()); m != nil {
			r.names[m[1]] = true
		}
	}
	return r.Registry.Register(c)
}

func (r *recordingRegistry) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := r.Register(c); err != nil {
			panic(err)
		}
	}
}

// exportedMetrics returns every series name the daemon and the worker
// library export, each from a fresh registry built in-process as they
// build theirs: the daemon's holds reaper.NewMetrics and the Go and
// process collectors (startMetricsServer); a worker's holds the start
// guard's and the jobs.Store's metrics (queue.WithRegisterer,
// jobs.WithRegisterer) and the Go and process collectors, as
// docs/worker.md's worker program registers them. A histogram or summary
// adds its _bucket, _sum and _count series.
func exportedMetrics(t *testing.T) map[string]bool {
	t.Helper()
	daemon := newRecordingRegistry()
	reaper.NewMetrics(daemon)
	daemon.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	worker := newRecordingRegistry()
	queue.NewGuard(nil, nil, queue.WithRegisterer(worker))
	jobs.NewStore(nil, jobs.WithRegisterer(worker))
	worker.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	out := map[string]bool{}
	for _, r := range []*recordingRegistry{daemon, worker} {
		families, err := r.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range families {
			r.names[f.GetName()] = true
		}
		for name := range r.names {
			for _, suffix := range []string{"", "_bucket", "_sum", "_count"} {
				out[name+suffix] = true
			}
		}
	}
	return out
}

// PromQL, as far as finding the metric names of an expression needs:
// string literals, label matchers, range and subquery brackets and the
// label lists of grouping modifiers hold no metric name; an identifier
// followed by "(" is a function or an aggregation; a few words are
// operators and modifiers.
var (
	promqlString   = regexp.MustCompile(`"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|` + "`[^`]*`")
	promqlMatchers = regexp.MustCompile(`\{[^}]*\}`)
	promqlRange    = regexp.MustCompile(`\[[^\]]*\]`)
	promqlGrouping = regexp.MustCompile(`\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)`)
	promqlIdent    = regexp.MustCompile(`\b[a-zA-Z_][a-zA-Z0-9_:]*\b(\s*\()?`)
	promqlWords    = []string{"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring",
		"group_left", "group_right", "inf", "nan", "atan2", "start", "end"}
)

// promqlMetricNames returns the metric names expr selects, in order.
func promqlMetricNames(expr string) []string {
	for _, re := range []*regexp.Regexp{promqlString, promqlMatchers, promqlRange, promqlGrouping} {
		expr = re.ReplaceAllString(expr, " ")
	}
	var names []string
	for _, m := range promqlIdent.FindAllStringSubmatch(expr, -1) {
		if m[1] != "" || slices.Contains(promqlWords, strings.ToLower(m[0])) {
			continue
		}
		names = append(names, m[0])
	}
	return names
}

func TestPromqlMetricNames(t *testing.T) {
	t.Parallel()
	for expr, want := range map[string][]string{
		`time() - max(jobreaper_last_success_timestamp_seconds{job=~"$job"}) > 5 * 60`: {"jobreaper_last_success_timestamp_seconds"},
		`histogram_quantile(0.99, sum by (le) (rate(jobreaper_scan_duration_seconds_bucket{job=~"a|b"}[$__rate_interval])))`: {
			"jobreaper_scan_duration_seconds_bucket"},
		`sum(rate(a_total[5m] offset 1h)) / on (queue) group_left (x) b_total unless c 1e3`: {"a_total", "b_total", "c"},
		`max without (instance) (go_goroutines) > bool 1000`:                                {"go_goroutines"},
	} {
		if got := promqlMetricNames(expr); !slices.Equal(got, want) {
			t.Errorf("promqlMetricNames(%q) = %q, want %q", expr, got, want)
		}
	}
}

// Every series the Grafana dashboard queries, in its panels and its
// variables, is one the daemon or the worker library exports, so that a
// renamed metric cannot leave an empty panel behind.
func TestGrafanaDashboardQueriesOnlyExportedMetrics(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile("../../deploy/grafana-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var dashboard struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
		Templating struct {
			List []struct {
				Name       string `json:"name"`
				Definition string `json:"definition"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(raw, &dashboard); err != nil {
		t.Fatal(err)
	}
	exported := exportedMetrics(t)
	queried := 0
	check := func(where, expr string, names []string) {
		if len(names) == 0 {
			t.Errorf("%s: %q queries no metric", where, expr)
		}
		for _, name := range names {
			queried++
			if !exported[name] {
				t.Errorf("%s queries %s, which neither the daemon nor the worker library exports", where, name)
			}
		}
	}
	for _, p := range dashboard.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, target := range p.Targets {
			check("panel "+p.Title, target.Expr, promqlMetricNames(target.Expr))
		}
	}
	labelValues := regexp.MustCompile(`^label_values\(([a-zA-Z_:][a-zA-Z0-9_:]*),`)
	for _, v := range dashboard.Templating.List {
		if v.Definition == "" {
			continue
		}
		m := labelValues.FindStringSubmatch(v.Definition)
		if m == nil {
			t.Errorf("variable %s: %q is not label_values(metric, label)", v.Name, v.Definition)
			continue
		}
		check("variable "+v.Name, v.Definition, m[1:])
	}
	for _, name := range []string{"jobreaper_broken_active_entries", "jobreaper_stale_queued_jobs",
		"jobreaper_redis_eviction_policy_unsafe", "jobreaper_lost_limit_tripped_total",
		"jobreaper_jobs_at_risk", "jobreaper_reap_delay_seconds_bucket", "jobreaper_job_runtime_seconds_bucket"} {
		if !strings.Contains(string(raw), name) {
			t.Errorf("the dashboard has no panel over %s", name)
		}
	}
	if queried < 20 {
		t.Fatalf("found %d metric names in the dashboard's queries; the parse lost some", queried)
	}
}
