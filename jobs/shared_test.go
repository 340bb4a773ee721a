package jobs_test

import (
	"slices"
	"testing"

	"github.com/jobreaper/jobreaper/internal/idcheck"
	"github.com/jobreaper/jobreaper/internal/pgcore"
	"github.com/jobreaper/jobreaper/internal/pgstore"
	"github.com/jobreaper/jobreaper/jobs"
)

// TestNamesMatchTheDaemons: jobs spells out, for its readers, the values
// it shares with the daemon's statements (internal/pgcore and
// internal/pgstore), which write and read the same columns; each must be
// the same.
func TestNamesMatchTheDaemons(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name      string
		got, want any
	}{
		{"StatusQueued", jobs.StatusQueued, pgcore.StatusQueued},
		{"StatusProcessing", jobs.StatusProcessing, pgcore.StatusProcessing},
		{"StatusCompleted", jobs.StatusCompleted, pgcore.StatusCompleted},
		{"StatusFailed", jobs.StatusFailed, pgcore.StatusFailed},
		{"ReasonStalled", jobs.ReasonStalled, pgstore.ReasonStalled},
		{"ReasonLostTask", jobs.ReasonLostTask, pgstore.ReasonLostTask},
		{"ReasonCancelled", jobs.ReasonCancelled, pgstore.ReasonCancelled},
		{"EventCancelled", jobs.EventCancelled, pgstore.EventCancelled},
		{"EventRequeued", jobs.EventRequeued, pgstore.EventRequeued},
		{"HookOnFailed", jobs.HookOnFailed, pgcore.HookOnFailed},
		{"HookOnCompleted", jobs.HookOnCompleted, pgcore.HookOnCompleted},
		{"HookOnRequeued", jobs.HookOnRequeued, pgcore.HookOnRequeued},
		{"MaxIDLength", jobs.MaxIDLength, idcheck.MaxIDLength},
		{"MaxDuration", jobs.MaxDuration, pgcore.MaxDuration},
		{"SchemaDefault", jobs.SchemaDefault, pgcore.SchemaDefault},
		{"OpTimeoutDefault", jobs.OpTimeoutDefault, pgcore.OpTimeoutDefault},
	} {
		if c.got != c.want {
			t.Errorf("jobs.%s = %v, the daemon's is %v", c.name, c.got, c.want)
		}
	}
	if !slices.Equal(jobs.CascadeArgNames, pgcore.CascadeArgNames) {
		t.Errorf("jobs.CascadeArgNames = %v, the cascades accept %v", jobs.CascadeArgNames, pgcore.CascadeArgNames)
	}
}
