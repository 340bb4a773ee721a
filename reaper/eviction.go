package reaper

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/jobreaper/jobreaper/internal/asynqstate"
)

// EvictionCheckInterval is how often the daemon reads Redis's
// maxmemory-policy: at its first pass and then hourly, since a policy
// changes only by an operator's hand (or a managed service's upgrade) and
// the check is one CONFIG GET.
const EvictionCheckInterval = time.Hour

// EvictionChecker reads the maxmemory-policy of the Redis that holds the
// markers; *asynqstate.PolicyReader satisfies it. An error wrapping
// asynqstate.ErrConfigRefused means the Redis does not allow the check.
type EvictionChecker interface {
	EvictionPolicy(ctx context.Context) (string, error)
}

// evictionState remembers when the policy was last read and whether the
// refusal has been reported already.
type evictionState struct {
	mu          sync.Mutex
	checkedAt   time.Time
	refusalSaid bool
}

// checkEviction reads the eviction policy when EvictionCheckInterval has
// passed since the last successful read (at once on the first pass). Any
// policy but noeviction is a warning naming the risk, and sets the gauge
// jobreaper_redis_eviction_policy_unsafe to 1. A Redis that refuses
// CONFIG GET is reported once at info level and not asked again for an
// interval. Nothing here is an error of the pass: the check never affects
// a reap, the exit code or readiness.
func (r *Reaper) checkEviction(ctx context.Context) {
	if r.opts.Eviction == nil || ctx.Err() != nil {
		return
	}
	st := &r.eviction
	st.mu.Lock()
	defer st.mu.Unlock()
	now := r.opts.Clock.Now()
	if !st.checkedAt.IsZero() && now.Sub(st.checkedAt) < EvictionCheckInterval {
		return
	}
	policy, err := r.opts.Eviction.EvictionPolicy(ctx)
	switch {
	case errors.Is(err, asynqstate.ErrConfigRefused):
		st.checkedAt = now
		if !st.refusalSaid {
			st.refusalSaid = true
			r.log.Info("could not check Redis's eviction policy: it refuses CONFIG GET (common on managed Redis); "+
				"make sure maxmemory-policy is noeviction, or markers may be evicted under memory pressure (the FAILED rows still guard, and passes restore lost markers)",
				"err", err)
		}
	case err != nil:
		if ctx.Err() == nil {
			r.log.Warn("could not read Redis's eviction policy; tried again next pass", "err", err)
		}
	case policy != asynqstate.EvictionPolicySafe:
		st.checkedAt = now
		r.opts.Metrics.evictionPolicy(true)
		r.log.Warn("Redis's maxmemory-policy is not noeviction: under memory pressure Redis may evict markers "+
			"(they have a TTL), and asynq's own keys; the FAILED rows still refuse reaped tasks and passes restore lost markers, "+
			"but set maxmemory-policy noeviction", "maxmemory_policy", policy)
	default:
		st.checkedAt = now
		r.opts.Metrics.evictionPolicy(false)
		r.log.Debug("Redis's eviction policy is safe", "maxmemory_policy", policy)
	}
}
