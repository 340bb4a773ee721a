package reaper

import (
	"hash/maphash"
	"sync"

	"github.com/jobreaper/jobreaper/internal/idcheck"
)

// Names that come from outside jobreaper (queue names from asynq:queues
// or from jobs rows, task IDs, job types from job_types) pass one check,
// idcheck.CheckName (task IDs: jobs.CheckID), before they reach a metric label
// or a SQL parameter: another client sharing the Redis can SADD any bytes
// into asynq:queues, and asynq's own client accepts a queue name holding a
// NUL byte. Prometheus's client panics on a label value that is not valid
// UTF-8, and PostgreSQL refuses a whole statement over one such text value.

// invalidLabel is the label value a name that fails idcheck.CheckName is
// counted under (a job type or a queue of a reaped job, a queue of a stale
// QUEUED row): such a name can be no label value, and its count must not
// be lost.
const invalidLabel = "(invalid)"

// labelValue returns name when it can be a metric label value, else
// invalidLabel.
func labelValue(name string) string {
	if idcheck.CheckName("name", name) != nil {
		return invalidLabel
	}
	return name
}

// badQueueNamesRemembered bounds how many bad queue names a process
// remembers having warned about (8 bytes each): past it, a new one is
// warned about at every pass, and memory stays bounded whatever another
// client writes into asynq:queues.
const badQueueNamesRemembered = 10000

// badQueueNames remembers, per process, the bad queue names already
// warned about, by a hash of the name (a name can be megabytes long).
type badQueueNames struct {
	mu     sync.Mutex
	seed   maphash.Seed
	warned map[uint64]struct{}
}

// first reports whether name has not been warned about yet, and remembers
// it.
func (b *badQueueNames) first(name string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.warned == nil {
		b.seed, b.warned = maphash.MakeSeed(), map[uint64]struct{}{}
	}
	h := maphash.String(b.seed, name)
	if _, ok := b.warned[h]; ok {
		return false
	}
	if len(b.warned) < badQueueNamesRemembered {
		b.warned[h] = struct{}{}
	}
	return true
}

// checkQueues returns the queues of the pass without those whose name
// idcheck.CheckName refuses: each such name is skipped for the pass (neither
// listed, nor looked for lost tasks, nor sent to PostgreSQL, nor a label),
// counted in Result.BadQueueNames and jobreaper_bad_queue_names, and
// warned about, quoted, once per process. queues is not modified.
func (r *Reaper) checkQueues(queues []string, res *Result) []string {
	kept := make([]string, 0, len(queues))
	for _, q := range queues {
		err := idcheck.CheckName("queue name", q)
		if err == nil {
			kept = append(kept, q)
			continue
		}
		res.BadQueueNames++
		if r.badNames.first(q) {
			r.log.Warn("queue skipped: its name cannot be a PostgreSQL text value or a metric label (a NUL byte, invalid UTF-8 "+
				"or over 1,024 bytes), so none of its tasks can be a job of the jobs table; another client writes "+
				"asynq:queues in this Redis? Warned once; counted in jobreaper_bad_queue_names at every pass",
				"queue", idcheck.QuoteID(q), "err", err.Error())
		}
	}
	r.opts.Metrics.badQueueNames(res.BadQueueNames)
	return kept
}
