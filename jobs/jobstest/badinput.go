package jobstest

import (
	"sync/atomic"
	"testing"
)

// BadInputs counts the bad inputs one TestReliabilityBadInput... test
// tries (one subtest each) and the ones whose subtest failed, and records
// both as the "badinput" figures "inputs" and "violations" when the test
// ends, after its parallel subtests.
type BadInputs struct {
	tried, failed atomic.Int64
}

// NewBadInputs returns the tally of t, recorded at t's cleanup.
func NewBadInputs(t *testing.T) *BadInputs {
	t.Helper()
	b := &BadInputs{}
	t.Cleanup(func() {
		Figure(t, "badinput", "inputs", b.tried.Load())
		Figure(t, "badinput", "violations", b.failed.Load())
	})
	return b
}

// Try counts the subtest t as one bad input tried, and as a violation if
// it fails.
func (b *BadInputs) Try(t *testing.T) {
	t.Helper()
	b.tried.Add(1)
	t.Cleanup(func() {
		if t.Failed() {
			b.failed.Add(1)
		}
	})
}
