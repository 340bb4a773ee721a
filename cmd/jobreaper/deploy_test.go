package main

import (
	"os"
	"regexp"
	"slices"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/queue"
	"github.com/jobreaper/jobreaper/reaper"
)

// descRecorder is a prometheus.Registerer that records the names of the
// metrics registered with it, labelled or not.
type descRecorder struct{ names []string }

var fqName = regexp.MustCompile(`fqName: "([^"]+)"`)

func (d *descRecorder) Register(c prometheus.Collector) error {
	ch := make(chan *prometheus.Desc)
	go func() { c.Describe(ch); close(ch) }()
	for desc := range ch {
		if m := fqName.FindStringSubmatch(desc.String()); m != nil {
			d.names = append(d.names, m[1], m[1]+"_bucket", m[1]+"_sum", m[1]+"_count")
		}
	}
	return nil
}

func (d *descRecorder) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		_ = d.Register(c)
	}
}

func (d *descRecorder) Unregister(prometheus.Collector) bool { return true }

// Every series the Grafana dashboard queries must be one the reaper or the
// worker library (start guard, jobs.Store) exports, so that a renamed
// metric cannot leave an empty panel behind.
func TestGrafanaDashboardQueriesOnlyExportedMetrics(t *testing.T) {
	t.Parallel()
	rec := &descRecorder{}
	reaper.NewMetrics(rec)
	queue.NewGuard(nil, nil, queue.WithRegisterer(rec))
	jobs.NewStore(nil, jobs.WithRegisterer(rec))
	raw, err := os.ReadFile("../../deploy/grafana-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	used := regexp.MustCompile(`jobreaper_[a-z_]+`).FindAllString(string(raw), -1)
	if len(used) == 0 {
		t.Fatal("the dashboard queries no jobreaper metric")
	}
	for _, name := range used {
		if !slices.Contains(rec.names, name) {
			t.Errorf("the dashboard queries %s, which the reaper does not export", name)
		}
	}
}
