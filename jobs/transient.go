package jobs

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jobreaper/jobreaper/internal/pgcore"
)

// finalBackoff is the pause before each retry of a finalization write
// (Fail, Release, AutoComplete, and the start of CompleteWith): five
// retries over 7.75 s in all. A blip of a few seconds (a failover, a
// restart, dropped connections) is over within it; a longer outage hands
// the decision back to the caller after those 7.75 s plus the tries' own
// timeouts.
var finalBackoff = [...]time.Duration{
	250 * time.Millisecond, 500 * time.Millisecond, time.Second, 2 * time.Second, 4 * time.Second,
}

// retryFinal runs try until it succeeds, fails with an error transient
// does not accept, or the retries of finalBackoff are used up, pausing
// between tries; each try gets its own operation timeout from the calls it
// makes. ctx ends the retries early (the guard passes a context detached
// from the handler's). maybeDone tells a try that an earlier try's COMMIT
// went out without an answer (ErrCommitUnknown), so that finding the job
// already as this write would leave it is this write's own success, not a
// late result. The error returned is the last try's, saying how many tries
// were made when there was more than one.
func (s *Store) retryFinal(ctx context.Context, try func(ctx context.Context, maybeDone bool) error) error {
	maybeDone := false
	for i := 0; ; i++ {
		err := try(ctx, maybeDone)
		if err == nil || !pgcore.Transient(err) || ctx.Err() != nil {
			return err
		}
		if i == len(finalBackoff) {
			return fmt.Errorf("%w (gave up after %d tries)", err, i+1)
		}
		maybeDone = maybeDone || errors.Is(err, ErrCommitUnknown)
		pause := time.NewTimer(finalBackoff[i])
		select {
		case <-ctx.Done():
			pause.Stop()
			return err
		case <-pause.C:
		}
	}
}
