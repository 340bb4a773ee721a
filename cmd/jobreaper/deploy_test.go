package main

import (
	"regexp"

	"github.com/prometheus/client_golang/prometheus"
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
