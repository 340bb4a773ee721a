package queue_test

import (
	"fmt"
	"runtime"
	"strings"
	"time"

	"pgregory.net/rapid"
)

// The plan of one interleaving of the race suite, drawn by rapid before any
// goroutine starts (rapid's draws are not safe for concurrent use): per
// job, the attempts that workers run through the start guard, each a list
// of steps with jitters between them; an operator's requeue and the
// product's second life of the ID; and the reaper's passes.

// flow is a seed flow of jobstest, one job of each per interleaving.
type flow int

const (
	// flowCourse: report.export, completed with its chapter, lesson and
	// lecture (jobstest.AddChapters).
	flowCourse flow = iota
	// flowVideo: video.transcode, completed READY, then metadata, then a
	// charge (jobstest.ComposeVideo).
	flowVideo
	// flowBatch: crawl.site, completed with no product rows of its own.
	flowBatch
	flowCount
)

func (f flow) String() string { return [...]string{"course", "video", "batch"}[f] }

// jobType is the job_types name of f's jobs.
func (f flow) jobType() string {
	return [...]string{"report.export", "video.transcode", "crawl.site"}[f]
}

// op is one step of an attempt. Every job of every flow resumes through
// batches (jobstest.Batch: one item per batch, token "b<cursor>") before
// its flow's completion.
type op int

const (
	// opHeartbeat: Heartbeater.Heartbeat with the mark generation*1000 +
	// k, so that a landed mark names the generation that wrote it; arg 0
	// repeats the last mark (an idle ticker).
	opHeartbeat op = iota
	// opAdvance: the next batch at the attempt's cursor.
	opAdvance
	// opReplay: a batch this life already recorded, sent again (B14).
	opReplay
	// opComplete: the flow's completion; arg 2 makes a video's metadata
	// update fail.
	opComplete
	// opFail: Store.Fail with the code failed_g<generation>.
	opFail
	// opRelease: Store.Release, as after an error asynq retries.
	opRelease
	// opHang: the handler blocks on an external call for hangMicros[arg]
	// microseconds, writing nothing: the job looks stalled meanwhile.
	opHang
)

// hangMicros are opHang's durations: each is longer than a reaper pass
// here, so that a pass may read, judge and reap the job while it hangs.
var hangMicros = [...]int{3000, 10000, 25000}

func (o op) String() string {
	return [...]string{"heartbeat", "advance", "replay", "complete", "fail", "release", "hang"}[o]
}

// jitter is a delay: yields goroutine switches, then a sleep of micros
// microseconds. It shifts one goroutine against the others; nothing waits
// for an effect with it.
type jitter struct {
	yields, micros int
}

func (j jitter) wait() {
	for range j.yields {
		runtime.Gosched()
	}
	if j.micros > 0 {
		time.Sleep(time.Duration(j.micros) * time.Microsecond)
	}
}

func (j jitter) String() string { return fmt.Sprintf("~%d/%dus", j.yields, j.micros) }

type step struct {
	op     op
	arg    int
	before jitter
}

// ret is what a handler returns after its steps.
type ret int

const (
	retNil       ret = iota // success: the outcome mapping completes or fails it (no_completion)
	retRetryable            // an error asynq retries: the mapping releases the job
	retSkipRetry            // a permanent error: the mapping fails it (handler_error)
	retCoded                // queue.Failure with its own code and SkipRetry
	retRevoke               // asynq.RevokeTask: the mapping fails it (task_revoked)
)

func (r ret) String() string {
	return [...]string{"nil", "retryable", "skip_retry", "coded", "revoke"}[r]
}

// attemptPlan is one delivery of a job's task to a worker: the guard
// claims (or refuses), the handler runs steps, returns ret, and after the
// guard returned the attempt may go on writing with its lease (late, a
// zombie that ignores its cancellation).
type attemptPlan struct {
	worker      int
	before      jitter
	steps       []step
	stopOnError bool
	ret         ret
	late        []step
}

type jobPlan struct {
	flow     flow
	total    int64
	attempts []attemptPlan
	// requeue: an operator requeues the job if it is FAILED then.
	requeue *jitter
	// relife: the product deletes the job and inserts its ID again if it
	// is COMPLETED or FAILED then (not for videos, whose metadata writes
	// are not fenced by design).
	relife *jitter
}

type passPlan struct {
	before jitter
	// markersFail makes the pass's marker writes fail, as when Redis goes
	// away between the reap's commit and its marker write.
	markersFail bool
}

type racePlan struct {
	jobs   []jobPlan
	passes []passPlan
	// stall is the stall timeout of every pass: 1 microsecond (whatever
	// the reaper reads as PROCESSING is stalled, and only the
	// compare-and-set keeps a job that moved since the read), or a few
	// milliseconds (a heartbeat or a batch keeps the job from being
	// reaped for that long).
	stall time.Duration
}

// workers is how many worker processes (start guards, Heartbeaters) the
// attempts are spread over.
const workers = 3

var (
	jitterGen = rapid.Custom(func(t *rapid.T) jitter {
		return jitter{
			yields: rapid.IntRange(0, 8).Draw(t, "yields"),
			// A PostgreSQL round trip takes a few hundred microseconds
			// to a few milliseconds here: sleeps of that size move a step
			// past another goroutine's statement.
			micros: rapid.SampledFrom([]int{0, 0, 0, 100, 300, 1000, 2500}).Draw(t, "micros"),
		}
	})
	// spreadGen places a goroutine's start anywhere in the span of an
	// interleaving (a few to tens of milliseconds of statements): a pass
	// after a claim, a redelivery after a reap, a requeue or a second
	// life after the job ended.
	spreadGen = rapid.Custom(func(t *rapid.T) jitter {
		return jitter{
			yields: rapid.IntRange(0, 8).Draw(t, "yields"),
			micros: rapid.SampledFrom([]int{0, 0, 1000, 3000, 6000, 10000, 20000, 40000}).Draw(t, "micros"),
		}
	})
	stepGen = rapid.Custom(func(t *rapid.T) step {
		return step{
			op: rapid.SampledFrom([]op{opHeartbeat, opHeartbeat, opAdvance, opAdvance, opAdvance, opReplay,
				opComplete, opComplete, opFail, opRelease, opHang}).Draw(t, "op"),
			arg:    rapid.IntRange(0, 2).Draw(t, "arg"),
			before: jitterGen.Draw(t, "before"),
		}
	})
	attemptGen = rapid.Custom(func(t *rapid.T) attemptPlan {
		return attemptPlan{
			worker:      rapid.IntRange(0, workers-1).Draw(t, "worker"),
			before:      spreadGen.Draw(t, "before"),
			steps:       rapid.SliceOfN(stepGen, 0, 6).Draw(t, "steps"),
			stopOnError: rapid.Bool().Draw(t, "stopOnError"),
			ret:         rapid.SampledFrom([]ret{retNil, retNil, retRetryable, retRetryable, retSkipRetry, retCoded, retRevoke}).Draw(t, "ret"),
			late:        rapid.SliceOfN(stepGen, 0, 2).Draw(t, "late"),
		}
	})
)

func drawPlan(t *rapid.T) racePlan {
	var p racePlan
	for f := range flowCount {
		j := jobPlan{
			flow:     f,
			total:    rapid.Int64Range(1, 4).Draw(t, "total"),
			attempts: rapid.SliceOfN(attemptGen, 1, 3).Draw(t, "attempts"),
		}
		if rapid.Bool().Draw(t, "requeue") {
			d := spreadGen.Draw(t, "requeueAt")
			j.requeue = &d
		}
		if f != flowVideo && rapid.IntRange(0, 3).Draw(t, "relife") == 0 {
			d := spreadGen.Draw(t, "relifeAt")
			j.relife = &d
		}
		p.jobs = append(p.jobs, j)
	}
	p.stall = rapid.SampledFrom([]time.Duration{time.Microsecond, 2 * time.Millisecond, 10 * time.Millisecond}).Draw(t, "stall")
	for range rapid.IntRange(1, 3).Draw(t, "passes") {
		p.passes = append(p.passes, passPlan{
			before:      spreadGen.Draw(t, "passAt"),
			markersFail: rapid.IntRange(0, 3).Draw(t, "markersFail") == 0,
		})
	}
	return p
}

// String prints the plan for a failure report.
func (p racePlan) String() string {
	var b strings.Builder
	for _, j := range p.jobs {
		fmt.Fprintf(&b, "%s (total %d):", j.flow, j.total)
		for i, a := range j.attempts {
			fmt.Fprintf(&b, "\n  attempt %d on w%d after %s, stop on error %v, returns %s:", i, a.worker, a.before, a.stopOnError, a.ret)
			for _, s := range a.steps {
				fmt.Fprintf(&b, " %s(%d)%s", s.op, s.arg, s.before)
			}
			if len(a.late) > 0 {
				b.WriteString("; late:")
				for _, s := range a.late {
					fmt.Fprintf(&b, " %s(%d)%s", s.op, s.arg, s.before)
				}
			}
		}
		if j.requeue != nil {
			fmt.Fprintf(&b, "\n  requeue after %s", *j.requeue)
		}
		if j.relife != nil {
			fmt.Fprintf(&b, "\n  second life after %s", *j.relife)
		}
		b.WriteString("\n")
	}
	for _, ps := range p.passes {
		fmt.Fprintf(&b, "pass after %s, marker writes fail %v\n", ps.before, ps.markersFail)
	}
	fmt.Fprintf(&b, "stall timeout %s\n", p.stall)
	return b.String()
}
