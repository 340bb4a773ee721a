package jobstest

import (
	"encoding/json"
	"os"
	"path/filepath"
	"sync"
	"testing"
)

// FiguresDirEnv names the environment variable that, when set to a
// directory, makes Figure record the reliability suites' figures there
// (bash .ci/reliability sets it and prints them as one table).
const FiguresDirEnv = "JOBREAPER_FIGURES_DIR"

var figuresMu sync.Mutex

// Figure records one figure of the reliability report: suite ("race",
// "faults", "soak", "badinput"), name (for example "interleavings",
// "violations", "reap_delay_p99_ms") and value (a number or a string such
// as a seed). Figures of the same suite and name are summed by the report
// when they are numbers and listed when they are strings. Without
// JOBREAPER_FIGURES_DIR it only logs the figure. A write error fails the
// test: a report that silently drops figures would under-count faults.
func Figure(t testing.TB, suite, name string, value any) {
	t.Helper()
	t.Logf("figure %s/%s = %v", suite, name, value)
	dir := os.Getenv(FiguresDirEnv)
	if dir == "" {
		return
	}
	line, err := json.Marshal(struct {
		Suite string `json:"suite"`
		Test  string `json:"test"`
		Name  string `json:"name"`
		Value any    `json:"value"`
	}{suite, t.Name(), name, value})
	if err != nil {
		t.Fatalf("figure %s/%s: %v", suite, name, err)
	}
	figuresMu.Lock()
	defer figuresMu.Unlock()
	f, err := os.OpenFile(filepath.Join(dir, "figures.jsonl"), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		t.Fatalf("figure %s/%s: %v", suite, name, err)
	}
	defer f.Close()
	if _, err := f.Write(append(line, '\n')); err != nil {
		t.Fatalf("figure %s/%s: %v", suite, name, err)
	}
}
