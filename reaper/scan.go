package reaper

import (
	"context"
	"log/slog"
	"slices"
	"time"

	"github.com/jobreaper/jobreaper/internal/asynqstate"
	"github.com/jobreaper/jobreaper/internal/idcheck"
)

// ActiveStreamer is a lister that reads many queues' active lists at once
// and hands them over chunk by chunk as Redis answers; *asynqstate.IDLister is
// one. The pass loads and judges one part of the list while Redis still
// reads and checks the next. A lister without it is read queue by queue
// with ListActive.
type ActiveStreamer interface {
	StreamActive(ctx context.Context, queues []string, fn func(asynqstate.ActiveChunk))
}

// scanChunksBuffered bounds the chunks listed ahead of the loads, and so
// the IDs a pass holds besides its ID list and one load batch.
const scanChunksBuffered = 16

// queueScan is what the pass has seen of one queue's active list so far.
type queueScan struct {
	emptyIDs int
	broken   []string
	noLease  []string
	bad      []string
}

// scanActive lists the active tasks of queues and, as the IDs come in,
// loads and judges them one load batch (Options.LoadBatch IDs, sorted) at
// a time, keeping the stalled ones in j (the pass reaps them once all are
// judged): the listing runs on its own goroutine, so Redis checks the
// next chunks while PostgreSQL loads the last batch. It returns
// the IDs of every active task, sorted and each once (the one list a pass
// holds in full), the queues that were listed completely (a queue asynq
// never saw counts as listed and empty), and the active entries that have
// no lease (broken: asynq never recovers them), whose jobs the lost-task
// search judges as if their task were gone.
//
// A queue that fails to list is an error of the pass and is not among the
// listed queues, so the lost-task search does not look at it; the chunks
// of it read before the failure were read and checked whole, and their
// jobs are judged like any other.
func (r *Reaper) scanActive(ctx context.Context, queues []string, now time.Time, res *Result, j *judgement) (ids, listed []string, noLease map[string]bool) {
	chunks := make(chan asynqstate.ActiveChunk, scanChunksBuffered)
	// A panic of the listing is recovered on its goroutine and raised
	// again on the pass's once the chunks are taken (RunOnce recovers
	// it). A panic of the pass stops the listing and takes its remaining
	// chunks, so that the listing goroutine never blocks on a send
	// nobody takes.
	lctx, stopListing := context.WithCancel(ctx)
	var listPanic *recovered
	defer func() {
		stopListing()
		for range chunks {
		}
	}()
	go func() {
		defer close(chunks)
		defer func() {
			if v := recover(); v != nil {
				listPanic = capture(v)
			}
		}()
		if s, ok := r.lister.(ActiveStreamer); ok {
			s.StreamActive(lctx, queues, func(c asynqstate.ActiveChunk) { chunks <- c })
			return
		}
		for _, q := range queues {
			tasks, err := r.lister.ListActive(lctx, q)
			chunks <- asynqstate.ActiveChunk{Queue: q, ActiveTasks: tasks, Done: err == nil, Err: err}
		}
	}()
	debug := r.log.Enabled(ctx, slog.LevelDebug)
	noLease = map[string]bool{}
	broken := map[string]int{}
	defer func() { r.opts.Metrics.brokenActiveCounts(broken) }()
	scans := map[string]*queueScan{}
	var pending []string
	// An ID listed twice (in two queues, or twice in a list that moved)
	// is judged once: each batch drops the IDs it holds twice and those
	// an earlier batch loaded (ids holds those, sorted and each once;
	// a binary search each, no set beside the list: a map of 100,000 IDs
	// cost 5 to 8 MiB of the process's peak RSS).
	load := func(batch []string) {
		listed := len(batch)
		slices.Sort(batch)
		batch = slices.Compact(batch)
		batch = slices.DeleteFunc(batch, func(id string) bool {
			_, loaded := slices.BinarySearch(ids, id)
			return loaded
		})
		res.scannedAs(ScannedDuplicate, listed-len(batch))
		if len(batch) == 0 {
			return
		}
		r.judgeLoaded(ctx, batch, now, debug, res, j)
		ids = mergeSorted(ids, batch)
	}
	// Every chunk is taken, also after ctx is done, so that the listing
	// goroutine always ends.
	for c := range chunks {
		q := c.Queue
		if c.Err != nil {
			r.failed(ctx, res, stageList, "listing active tasks failed; this queue is skipped this pass", "queue", q, "err", c.Err)
			continue
		}
		sc := scans[q]
		if sc == nil {
			sc = &queueScan{}
			scans[q] = sc
		}
		res.BrokenActive += c.EmptyIDs + len(c.NoLease)
		res.Scanned += len(c.NoLease)
		res.scannedAs(ScannedNoLease, len(c.NoLease))
		sc.noLease = append(sc.noLease, c.NoLease...)
		for _, id := range c.NoLease {
			noLease[id] = true
		}
		if c.NotFound {
			r.opts.Metrics.queueMissing(q)
			res.QueuesNotFound = append(res.QueuesNotFound, q)
		} else {
			res.Scanned += len(c.IDs) + c.EmptyIDs
			res.skip(SkipNoJobID, c.EmptyIDs)
			res.scannedAs(string(SkipNoJobID), c.EmptyIDs)
			sc.emptyIDs += c.EmptyIDs
			sc.broken = append(sc.broken, c.Broken...)
			kept, bad := splitBadIDs(c.IDs)
			res.skip(SkipBadJobID, len(bad))
			res.scannedAs(string(SkipBadJobID), len(bad))
			sc.bad = append(sc.bad, bad...)
			pending = append(pending, kept...)
			for len(pending) >= r.opts.LoadBatch {
				load(slices.Clone(pending[:r.opts.LoadBatch]))
				pending = append(pending[:0], pending[r.opts.LoadBatch:]...)
			}
		}
		if c.Done {
			listed = append(listed, q)
			r.warnBroken(q, sc)
			broken[q] = sc.emptyIDs + len(sc.noLease)
			delete(scans, q)
		}
	}
	if listPanic != nil { // set before chunks was closed
		panic(listPanic)
	}
	if len(pending) > 0 {
		load(pending)
	}
	r.warnQueuesNotFound(ctx, res)
	return ids, listed, noLease
}

// warnQueuesNotFound sorts Result.QueuesNotFound and warns about each
// queue in it, with a did-you-mean among the queues asynq knows in that
// Redis when one is close (Options.Suggest; asynq's queue list is read
// once, only when a queue was not found).
func (r *Reaper) warnQueuesNotFound(ctx context.Context, res *Result) {
	if len(res.QueuesNotFound) == 0 {
		return
	}
	slices.Sort(res.QueuesNotFound)
	var known []string
	if r.opts.Suggest != nil && ctx.Err() == nil {
		all, err := r.lister.Queues(ctx)
		if err != nil {
			r.log.Warn("reading asynq's queue list for a did-you-mean failed", "err", err)
		}
		for _, q := range all {
			if idcheck.CheckName("queue name", q) == nil {
				known = append(known, q)
			}
		}
	}
	for _, q := range res.QueuesNotFound {
		attrs := []any{"queue", q}
		if near := r.suggest(q, known); near != "" {
			if res.QueueSuggestions == nil {
				res.QueueSuggestions = map[string]string{}
			}
			res.QueueSuggestions[q] = near
			attrs = append(attrs, "did_you_mean", near)
		}
		r.log.Warn("queue not known to asynq; treated as empty (is the name a typo, or the Redis database a wrong one?)", attrs...)
	}
}

// suggest returns Options.Suggest's answer for q among known, "" without
// one.
func (r *Reaper) suggest(q string, known []string) string {
	if r.opts.Suggest == nil || len(known) == 0 {
		return ""
	}
	return r.opts.Suggest(q, known)
}

// mergeSorted merges b into a, both sorted and with no ID in common, in
// place (a grows by len(b)), and returns the merged slice.
func mergeSorted(a, b []string) []string {
	n := len(a)
	a = slices.Grow(a, len(b))[:n+len(b)]
	i, j := n-1, len(b)-1
	for k := len(a) - 1; j >= 0; k-- {
		if i >= 0 && a[i] > b[j] {
			a[k] = a[i]
			i--
		} else {
			a[k] = b[j]
			j--
		}
	}
	return a
}

// warnBroken logs queue's broken active entries and refused IDs, one
// warning per kind, once its listing is complete.
func (r *Reaper) warnBroken(q string, sc *queueScan) {
	if len(sc.noLease) > 0 {
		slices.Sort(sc.noLease)
		sc.noLease = slices.Compact(sc.noLease)
		r.log.Warn("broken active entries: they have no lease, so asynq never recovers them; "+
			"jobreaper does not write asynq's keys, and reaps their stalled jobs as lost_task",
			"queue", q, "count", len(sc.noLease), "task_ids", brokenSample(sc.noLease))
	}
	if sc.emptyIDs > 0 {
		attrs := []any{"queue", q, "count", sc.emptyIDs}
		if len(sc.broken) > 0 {
			slices.Sort(sc.broken)
			attrs = append(attrs, "task_ids", brokenSample(slices.Compact(sc.broken)))
		}
		r.log.Warn("broken active entries: their task hash is gone, so asynq will never run or recover them; "+
			"jobreaper does not write asynq's keys, and reaps their stalled jobs as lost_task", attrs...)
	}
	r.warnBadIDs(q, sc.bad)
}
