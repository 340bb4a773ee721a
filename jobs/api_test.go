package jobs_test

import (
	"flag"
	"slices"
	"testing"

	"github.com/jobreaper/jobreaper/internal/apilist"
)

var updateAPI = flag.Bool("update", false, "rewrite testdata/api.golden with the package's exported API")

// TestPublicAPI holds the exported API of jobs, what a worker author reads
// in go doc, to the reviewed list in testdata/api.golden: the worker's,
// the producer's and migration's calls, nothing of the daemon's.
func TestPublicAPI(t *testing.T) {
	got, err := apilist.List("github.com/jobreaper/jobreaper/jobs")
	if err != nil {
		t.Fatal(err)
	}
	const golden, how = "testdata/api.golden", "go test ./jobs -run TestPublicAPI -update"
	if *updateAPI {
		if err := apilist.Write(got, golden, []string{
			"The exported API of package jobs, as its users see it: one name per line, sorted,",
			"with its kind. TestPublicAPI compares it with the package; rewrite it with",
			"  " + how,
			"and let review see every name that comes or goes.",
		}); err != nil {
			t.Fatal(err)
		}
		return
	}
	if err := apilist.Compare(got, golden, how); err != nil {
		t.Error(err)
	}
}

// TestImportsNoDaemonPackage holds the arrows: the worker library imports neither queue nor reaper, nor the daemon's statements, so that a worker
// binary links none of them.
func TestImportsNoDaemonPackage(t *testing.T) {
	deps, err := apilist.Deps("github.com/jobreaper/jobreaper/jobs")
	if err != nil {
		t.Fatal(err)
	}
	for _, banned := range []string{"github.com/jobreaper/jobreaper/queue", "github.com/jobreaper/jobreaper/reaper", "github.com/jobreaper/jobreaper/internal/pgstore", "github.com/jobreaper/jobreaper/internal/asynqstate"} {
		if slices.Contains(deps, banned) {
			t.Errorf("jobs imports %s, directly or through another package", banned)
		}
	}
}
