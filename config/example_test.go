package config

import (
	"bytes"
	"errors"
	"io"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// The example shipped in deploy/ must load without unknown keys and, with
// the database URL the environment gives it, validate.
func TestExampleConfigLoadsAndValidates(t *testing.T) {
	t.Parallel()
	cfg, err := Load(Sources{
		File:    "../deploy/jobreaper.example.yaml",
		Environ: []string{"JOBREAPER_DATABASE_URL=postgres://jobreaper:pw@db:5432/app"},
	})
	if err != nil {
		t.Fatalf("loading the example: %v", err)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatalf("the example does not validate: %v", err)
	}
	// The header says every value set is its default, and that queues and
	// cascades are left out.
	want := Config{DatabaseURL: "postgres://jobreaper:pw@db:5432/app"}.WithDefaults()
	if !reflect.DeepEqual(cfg, want) {
		t.Fatalf("the example sets a value other than its default:\n got %+v\nwant %+v", cfg, want)
	}

	// The commented samples keep their form: uncommented, they load.
	raw, err := os.ReadFile("../deploy/jobreaper.example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	text := string(raw)
	for _, sample := range []string{"# queues:", "# cascades:"} {
		i := strings.Index(text, sample)
		if i < 0 {
			t.Fatalf("the example lost its %q sample", sample)
		}
		var out []string
		for _, line := range strings.SplitAfter(text[i:], "\n") {
			if !strings.HasPrefix(line, "# ") {
				break
			}
			out = append(out, strings.TrimPrefix(line, "# "))
		}
		text = text[:i] + strings.Join(out, "") + text[i+len(strings.Join(out, ""))+2*len(out):]
	}
	cfg, err = Load(Sources{File: writeFile(t, text), Environ: []string{"JOBREAPER_DATABASE_URL=postgres://jobreaper:pw@db:5432/app"}})
	if err != nil {
		t.Fatalf("loading the example with its samples uncommented: %v", err)
	}
	if !slices.Equal(cfg.Queues, []string{"default", "critical"}) {
		t.Fatalf("queues sample not read: %v", cfg.Queues)
	}
	c, ok := cfg.Cascades["video.transcode"]
	if !ok || len(c.OnFailed) != 1 || len(c.OnCompleted) != 2 || len(c.OnRequeued) != 1 {
		t.Fatalf("cascade sample not read: %#v", cfg.Cascades)
	}
}

// The configuration inside the Kubernetes example's ConfigMap must load and
// validate too.
func TestKubernetesExampleConfigLoadsAndValidates(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile("../deploy/kubernetes-sidecar.yaml")
	if err != nil {
		t.Fatal(err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(raw))
	var embedded string
	for {
		var doc struct {
			Kind string            `yaml:"kind"`
			Data map[string]string `yaml:"data"`
		}
		if err := dec.Decode(&doc); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("parsing the manifest: %v", err)
		}
		if doc.Kind == "ConfigMap" {
			embedded = doc.Data["jobreaper.yaml"]
		}
	}
	if embedded == "" {
		t.Fatal("the manifest has no ConfigMap with jobreaper.yaml")
	}
	cfg, err := Load(Sources{
		File:    writeFile(t, embedded),
		Environ: []string{"JOBREAPER_DATABASE_URL=postgres://jobreaper:pw@db:5432/app", "JOBREAPER_METRICS_ADDR=:9468"},
	})
	if err == nil {
		err = cfg.Validate()
	}
	if err != nil {
		t.Fatalf("the ConfigMap's config: %v", err)
	}
}
