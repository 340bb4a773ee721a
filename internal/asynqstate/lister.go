package asynqstate

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/hibiken/asynq"

	"github.com/jobreaper/jobreaper/queue"
)

// ListPageSizeDefault is the page size InspectorLister asks asynq for.
const ListPageSizeDefault = 1000

// ListPageSizeMin is the smallest page size InspectorLister accepts. asynq
// v0.26.0's Inspector.ListActiveTasks ships every task's payload and, on
// every page, also loads and decodes every expired lease of the queue
// (rdb.ListLeaseExpired) to mark orphans; small pages multiply that cost
// with the number of pages.
const ListPageSizeMin = 1000

// ActiveTasks is one queue's active list as the reaper's scan sees it.
type ActiveTasks struct {
	// IDs are the task IDs (= job IDs) of the active tasks, each once.
	IDs []string
	// EmptyIDs counts active entries whose task hash is gone: asynq lists
	// them with an empty ID, so they name no job.
	EmptyIDs int
	// Broken names those entries when the lister can tell (IDLister reads
	// the raw list, which still holds the ID; the Inspector cannot), sorted,
	// each once, for reconciling them. Their IDs are not in IDs.
	Broken []string
	// NoLease names the active entries whose task hash is there but that
	// have no lease: asynq never recovers them. They are not in IDs (their
	// jobs are judged by the lost-task search, as if the task were gone);
	// only IDLister can tell.
	NoLease []string
	// NotFound is true when asynq has never seen the queue (it is not in
	// asynq:queues); IDs is then empty. The reaper warns and counts it,
	// since the configured name may be a typo.
	NotFound bool
}

// ActiveLister lists active tasks for the reaper's scan.
type ActiveLister interface {
	// Queues returns every queue asynq knows, sorted by name.
	Queues(ctx context.Context) ([]string, error)
	// ListActive returns all active tasks of queue, reading every page. A
	// queue asynq never saw is ActiveTasks{NotFound: true} with a nil
	// error; any other failure is an error, and then none of the queue's
	// tasks may be reaped this pass.
	ListActive(ctx context.Context, queue string) (ActiveTasks, error)
}

// InspectorLister implements ActiveLister over an *asynq.Inspector.
//
// asynq's Inspector takes no context: ctx is checked before each call,
// and a single call is bounded by the Redis client's own read and write
// timeouts (go-redis defaults: 3 s per command), which the caller sets
// when building the client the Inspector uses.
type InspectorLister struct {
	inspector *asynq.Inspector
	pageSize  int
}

// ListerOption configures an InspectorLister.
type ListerOption func(*InspectorLister) error

// WithPageSize sets how many active tasks one Inspector call returns
// (default ListPageSizeDefault). n below ListPageSizeMin makes
// NewInspectorLister return an error wrapping queue.ErrBadOption.
func WithPageSize(n int) ListerOption {
	return func(l *InspectorLister) error {
		if n < ListPageSizeMin {
			return fmt.Errorf("asynqstate.WithPageSize(%d): %w: the page size must be at least %d, since asynq loads every expired lease of the queue on every page", n, queue.ErrBadOption, ListPageSizeMin)
		}
		l.pageSize = n
		return nil
	}
}

// NewInspectorLister returns an InspectorLister over inspector. It returns
// an error wrapping queue.ErrBadOption when an option's value breaks its rule.
func NewInspectorLister(inspector *asynq.Inspector, opts ...ListerOption) (*InspectorLister, error) {
	l := &InspectorLister{inspector: inspector, pageSize: ListPageSizeDefault}
	for _, o := range opts {
		if err := o(l); err != nil {
			return nil, err
		}
	}
	return l, nil
}

// Queues returns every queue asynq knows (the members of asynq:queues),
// sorted by name. Errors: ctx's error when ctx is already done; a wrapped
// Redis error naming the operation.
func (l *InspectorLister) Queues(ctx context.Context) ([]string, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("asynqstate.InspectorLister.Queues: %w", err)
	}
	qs, err := l.inspector.Queues()
	if err != nil {
		return nil, fmt.Errorf("asynqstate.InspectorLister.Queues: %w", err)
	}
	slices.Sort(qs)
	return qs, nil
}

// ListActive reads the active tasks of queue page by page until a page
// comes back empty, checking ctx before each page.
//
// Pages are offsets into asynq's active list (asynq:{<queue>}:active), so
// the list can move between two pages: an ID seen twice is kept once, and
// a task that started or finished meanwhile may be missed. A missed task
// is harmless: it is not reaped this pass and is seen again by the next.
// The loop ends on an empty page,
// not a short one, because asynq silently drops entries it cannot decode,
// so a short page does not prove the end of the list.
//
// It returns ActiveTasks{NotFound: true}, nil when asynq never saw queue
// (asynq.ErrQueueNotFound). Errors, each naming the queue: ctx's error
// when ctx is done before a page; any other Inspector error, wrapped.
func (l *InspectorLister) ListActive(ctx context.Context, queue string) (ActiveTasks, error) {
	var (
		out  ActiveTasks
		seen = make(map[string]struct{})
	)
	for page := 1; ; page++ {
		if err := ctx.Err(); err != nil {
			return ActiveTasks{}, fmt.Errorf("asynqstate.InspectorLister.ListActive: queue %q page %d: %w", queue, page, err)
		}
		infos, err := l.inspector.ListActiveTasks(queue, asynq.PageSize(l.pageSize), asynq.Page(page))
		if errors.Is(err, asynq.ErrQueueNotFound) {
			return ActiveTasks{NotFound: true}, nil
		}
		if err != nil {
			return ActiveTasks{}, fmt.Errorf("asynqstate.InspectorLister.ListActive: queue %q page %d: %w", queue, page, err)
		}
		if len(infos) == 0 {
			return out, nil
		}
		for _, info := range infos {
			if info.ID == "" {
				out.EmptyIDs++
				continue
			}
			if _, dup := seen[info.ID]; dup {
				continue
			}
			seen[info.ID] = struct{}{}
			out.IDs = append(out.IDs, info.ID)
		}
	}
}
