package fleettest

import (
	"fmt"
	"math/rand/v2"
	"time"
)

// The fault kinds of the fleet suite.
const (
	FaultLeaderKill   = "leader_sigkill"    // SIGKILL of the leader; a new daemon replaces it
	FaultLeaderStop   = "leader_sigstop"    // SIGSTOP of the leader past its lease TTL, then SIGCONT
	FaultLeaderCut    = "leader_pg_cut"     // the leader's PostgreSQL relay cut, the workers' kept
	FaultWorkersCut   = "workers_pg_cut"    // every worker's PostgreSQL relay cut, shorter than the stall timeout
	FaultPGRestart    = "pg_restart"        // PostgreSQL stopped and started under everyone
	FaultRedisRestart = "redis_restart"     // Redis stopped and started with its append-only file
	FaultWorkerKill   = "worker_sigkill"    // a worker SIGKILLed mid-batch; a new one replaces it
	FaultFailover     = "sentinel_failover" // a Redis failover through Sentinel
)

// FaultKinds lists every fault kind, in a fixed order.
var FaultKinds = []string{FaultLeaderKill, FaultLeaderStop, FaultLeaderCut, FaultWorkersCut, FaultPGRestart, FaultRedisRestart,
	FaultWorkerKill, FaultFailover}

// Fault is one fault of a schedule: at At after the run's start, Kind
// lasts Length (0: an instant, such as a SIGKILL); Target picks among the
// processes it may hit (the worker of a worker kill, modulo their
// number).
type Fault struct {
	At     time.Duration
	Kind   string
	Length time.Duration
	Target int
}

func (f Fault) String() string {
	return fmt.Sprintf("+%s %s for %s (target %d)", f.At.Round(time.Millisecond), f.Kind, f.Length.Round(time.Millisecond), f.Target)
}

// ScheduleParams bound a schedule.
type ScheduleParams struct {
	// Duration is the run's length; no fault starts in its last Settle.
	Duration time.Duration
	// Kinds are the fault kinds to draw from (those the machine can
	// inject).
	Kinds []string
	// StallTimeout bounds a workers-only cut (at most 60 % of it).
	StallTimeout time.Duration
	// LeaseTTL is the leader lease's TTL: a SIGSTOP lasts 2 to 4 of it.
	LeaseTTL time.Duration
	// Settle is the quiet time after each fault's end, before the next.
	Settle time.Duration
	// Start is the quiet time before the first fault.
	Start time.Duration
}

// Schedule draws the faults of one run from seed: every kind of p.Kinds
// once in a seeded order, then more in seeded draws, each starting Settle
// after the previous one ended, as many as fit in p.Duration. The same
// seed and parameters give the same schedule (the replay).
func Schedule(seed uint64, p ScheduleParams) []Fault {
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	between := func(lo, hi time.Duration) time.Duration {
		if hi <= lo {
			return lo
		}
		return lo + time.Duration(rng.Int64N(int64(hi-lo)))
	}
	length := func(kind string) time.Duration {
		switch kind {
		case FaultLeaderStop:
			return between(2*p.LeaseTTL, 4*p.LeaseTTL)
		case FaultLeaderCut:
			return between(3*time.Second, 8*time.Second)
		case FaultWorkersCut:
			// At most 2/5 of the stall timeout: the stall rule protects a
			// live job only while the cut, the heartbeat interval before
			// it (the limiter's last write may be that old) and the
			// reconnection after it stay under the stall timeout. A 30-
			// minute run with cuts up to 3/5 (6 s of 10 s, heartbeats
			// 2 s apart) saw a live job reaped 10.4 s after its last
			// recorded write, 2.6 s after its cut ended: a stall by the
			// rule, which the suite's stricter check (idle counted from
			// the cut's end) rightly flagged as a schedule outside it.
			return between(p.StallTimeout/5, p.StallTimeout*2/5)
		case FaultPGRestart:
			return between(2*time.Second, p.StallTimeout+2*time.Second)
		case FaultRedisRestart:
			return between(time.Second, 4*time.Second)
		}
		return 0
	}
	if len(p.Kinds) == 0 {
		return nil
	}
	order := make([]string, len(p.Kinds))
	copy(order, p.Kinds)
	rng.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
	var out []Fault
	at := p.Start
	for i := 0; ; i++ {
		kind := ""
		if i < len(order) {
			kind = order[i]
		} else {
			kind = p.Kinds[rng.IntN(len(p.Kinds))]
		}
		f := Fault{At: at + between(0, time.Second), Kind: kind, Length: length(kind), Target: rng.IntN(1 << 16)}
		if f.At+f.Length+p.Settle > p.Duration {
			return out
		}
		out = append(out, f)
		at = f.At + f.Length + p.Settle
	}
}
