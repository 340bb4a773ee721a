package pgcore

import (
	"context"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/jobreaper/jobreaper/internal/idcheck"
)

// Job statuses, as stored in jobs.status.
const (
	StatusQueued     = "QUEUED"
	StatusProcessing = "PROCESSING"
	StatusCompleted  = "COMPLETED"
	StatusFailed     = "FAILED"
)

// Snapshot is a job row as read, together with its type's limits. The
// reaper decides on it, and its reap repeats Status, Generation and
// UpdatedAt in the compare-and-set.
type Snapshot struct {
	ID, Type, Status string
	Generation       int64
	// FirstGeneration is the generation the job's current life started at
	// (see jobs.Lease.FirstGeneration); Generation equals it until the life's
	// first claim.
	FirstGeneration int64
	// Worker, Queue, ParentID are "" when NULL.
	Worker, Queue, ParentID string
	// StartedAt is nil when the row has no start time (never claimed).
	StartedAt *time.Time
	UpdatedAt time.Time
	// FailureReason is "" when NULL.
	FailureReason string
	// Limits is nil when no job_types row has the job's type.
	Limits *Limits
	// reapCount counts the retry reaps of the job's current life
	// (jobs.reap_count); see ReapBudget. Unexported: the retry budget is
	// the daemon's business, not a worker's (jobs.Snapshot aliases this
	// type).
	reapCount int
	// Unreadable is "" for a row read whole; otherwise it says which value
	// of the row Go cannot represent (a started_at or updated_at of
	// 'infinity' or '-infinity', which a product's own SQL can write). Such
	// a row has no runtime or idle time to judge: the reaper skips it as
	// bad_row instead of failing the whole batch it was read with, and the
	// time fields it names are zero.
	Unreadable string
	// updatedKey is updated_at as read, infinite values included: the
	// keyset position of the row in (updated_at, id) pages.
	updatedKey pgtype.Timestamptz
}

// UpdatedKey returns sn's updated_at as read, an infinite value included:
// its position in the (updated_at, id) keyset pages of the lost-task search.
func UpdatedKey(sn Snapshot) pgtype.Timestamptz { return sn.updatedKey }

// ReapBudget is a job's retry budget as read: the retry reaps of its
// current life (jobs.reap_count), how many its type allows
// (job_types.reap_retries; 0 also when the type is unknown) and the delay
// of a lost job's first retry (job_types.reap_retry_delay).
type ReapBudget struct {
	Count, Retries int
	Delay          time.Duration
}

// BudgetOf returns sn's retry budget.
func BudgetOf(sn Snapshot) ReapBudget {
	b := ReapBudget{Count: sn.reapCount}
	if sn.Limits != nil {
		b.Retries, b.Delay = sn.Limits.reapRetries, sn.Limits.reapRetryDelay
	}
	return b
}

// WithBudget returns sn with the retry budget b: its reap count, and, when
// it has limits, a copy of them with b's retries and delay. For snapshots
// built in code (tests, the reaper's fixtures).
func WithBudget(sn Snapshot, b ReapBudget) Snapshot {
	sn.reapCount = b.Count
	if sn.Limits != nil {
		l := *sn.Limits
		l.reapRetries, l.reapRetryDelay = b.Retries, b.Delay
		sn.Limits = &l
	}
	return sn
}

// Limits is a job_types row.
type Limits struct {
	// MaxRuntime is the soft limit; intervals convert with 30-day months and
	// 24-hour days, as PostgreSQL compares them.
	MaxRuntime time.Duration
	// StallTimeout is nil when NULL (the daemon default applies).
	StallTimeout *time.Duration
	// HardTimeout is nil when NULL (jobs.HardTimeoutDefault applies).
	HardTimeout *time.Duration
	// AutoComplete: a handler returning nil without Complete completes the job.
	AutoComplete bool
	// reapRetries and reapRetryDelay are job_types.reap_retries and
	// reap_retry_delay; see ReapBudget.
	reapRetries    int
	reapRetryDelay time.Duration

	// The limits in whole microseconds, exact up to IntervalMicros'
	// bound, when read from the database (exact is true); see LimitsMicros.
	exact                         bool
	maxRuntimeUs                  int64
	stallTimeoutUs, hardTimeoutUs *int64
}

// LimitsMicros returns l's limits in whole microseconds as PostgreSQL compares
// them (30-day months, 24-hour days); stall and hard are nil when NULL.
// For Limits read from the database they are exact up to about 292,000
// years (IntervalMicros), where MaxRuntime and the other durations stop
// at time.Duration's 292 years: a limit of '1000 years' must still compare
// as longer than '500 years' and shorter than a runtime of 2,000 years, as
// it does in pgstore.StallPredicate. For Limits built in code they are the
// durations, truncated to microseconds.
func LimitsMicros(l *Limits) (maxRuntime int64, stall, hard *int64) {
	if l.exact {
		return l.maxRuntimeUs, l.stallTimeoutUs, l.hardTimeoutUs
	}
	us := func(d *time.Duration) *int64 {
		if d == nil {
			return nil
		}
		v := d.Microseconds()
		return &v
	}
	return l.MaxRuntime.Microseconds(), us(l.StallTimeout), us(l.HardTimeout)
}

// LimitsCache lets the rows of one batch share one Limits per job type
// instead of one copy per row.
type LimitsCache map[string]*Limits

// Share returns the Limits the cache holds for typ when it equals l, else
// l, which it then holds; nil for nil.
func (c *LimitsCache) Share(typ string, l *Limits) *Limits {
	if l == nil {
		return nil
	}
	if *c == nil {
		*c = LimitsCache{}
	}
	if have, ok := (*c)[typ]; ok && equalLimits(*have, *l) {
		return have
	}
	(*c)[typ] = l
	return l
}

func equalLimits(a, b Limits) bool {
	eq := func(x, y *time.Duration) bool { return (x == nil) == (y == nil) && (x == nil || *x == *y) }
	eqUs := func(x, y *int64) bool { return (x == nil) == (y == nil) && (x == nil || *x == *y) }
	return a.MaxRuntime == b.MaxRuntime && a.AutoComplete == b.AutoComplete &&
		a.reapRetries == b.reapRetries && a.reapRetryDelay == b.reapRetryDelay &&
		eq(a.StallTimeout, b.StallTimeout) && eq(a.HardTimeout, b.HardTimeout) &&
		a.exact == b.exact && a.maxRuntimeUs == b.maxRuntimeUs &&
		eqUs(a.stallTimeoutUs, b.stallTimeoutUs) && eqUs(a.hardTimeoutUs, b.hardTimeoutUs)
}

// SnapshotColumns are the columns ScanSnapshot reads, of jobs j LEFT JOIN
// job_types t (JOIN for a statement that reads only typed rows).
const SnapshotColumns = `
    j.id, j.type, j.status, j.generation, coalesce(j.worker, ''), coalesce(j.queue, ''),
    coalesce(j.parent_id, ''), j.started_at, j.updated_at, coalesce(j.failure_reason, ''),
    t.name IS NOT NULL, t.max_runtime, t.stall_timeout, t.hard_timeout, coalesce(t.auto_complete, false),
    j.first_generation, j.reap_count, coalesce(t.reap_retries, 0), coalesce(t.reap_retry_delay, interval '0')`

// Get reads one job row and its type limits. It returns an error wrapping
// ErrNotFound when no row has that ID, and one wrapping idcheck.ErrBadID
// (nothing sent) for an ID no row can have (idcheck.CheckID: empty, a NUL byte, invalid
// UTF-8, over idcheck.MaxIDLength), which PostgreSQL would answer with a driver
// error and the ID's raw bytes.
func (c *Core) Get(ctx context.Context, id string) (Snapshot, error) {
	ctx, done := c.Op(ctx, "Get")
	if err := idcheck.CheckID(id); err != nil {
		return Snapshot{}, done(err)
	}
	rows, err := c.db.Query(ctx, c.Q(`SELECT `+SnapshotColumns+`
  FROM {schema}.jobs j LEFT JOIN {schema}.job_types t ON t.name = j.type
 WHERE j.id = $1`), id)
	if err != nil {
		return Snapshot{}, done(err)
	}
	sn, err := pgx.CollectExactlyOneRow(rows, ScanSnapshot)
	if err != nil {
		return Snapshot{}, done(fmt.Errorf("job %s: %w", id, err))
	}
	return sn, done(nil)
}

// ScanSnapshot reads one row of SnapshotColumns. An infinite started_at or
// updated_at does not fail the row: Snapshot.Unreadable says which.
func ScanSnapshot(row pgx.CollectableRow) (Snapshot, error) {
	var (
		sn                    Snapshot
		started               pgtype.Timestamptz
		known, auto           bool
		maxRun, stall, hardTO pgtype.Interval
		retries               int32
		retryDelay            pgtype.Interval
	)
	// The timestamps are scanned into pgtype.Timestamptz, which holds
	// 'infinity': scanning it into a time.Time fails, and pgx then ends
	// the whole result, so one odd row would stop the reaps of its batch.
	err := row.Scan(&sn.ID, &sn.Type, &sn.Status, &sn.Generation, &sn.Worker, &sn.Queue,
		&sn.ParentID, &started, &sn.updatedKey, &sn.FailureReason,
		&known, &maxRun, &stall, &hardTO, &auto, &sn.FirstGeneration, &sn.reapCount, &retries, &retryDelay)
	if err != nil {
		return sn, err
	}
	finishSnapshot(&sn, started)
	if known {
		sn.Limits = newLimits(maxRun, stall, hardTO, auto, retries, retryDelay)
	}
	return sn, nil
}

// finishSnapshot sets sn's UpdatedAt, StartedAt and Unreadable from the
// timestamps as read (sn.updatedKey and started).
func finishSnapshot(sn *Snapshot, started pgtype.Timestamptz) {
	if sn.updatedKey.InfinityModifier == pgtype.Finite {
		sn.UpdatedAt = sn.updatedKey.Time
	} else {
		sn.Unreadable = "updated_at is " + sn.updatedKey.InfinityModifier.String()
	}
	switch {
	case !started.Valid:
	case started.InfinityModifier != pgtype.Finite:
		sn.Unreadable = strings.TrimPrefix(sn.Unreadable+"; ", "; ") + "started_at is " + started.InfinityModifier.String()
	default:
		t := started.Time
		sn.StartedAt = &t
	}
}

// newLimits builds the Limits of a job_types row as read.
func newLimits(maxRun, stall, hardTO pgtype.Interval, auto bool, retries int32, retryDelay pgtype.Interval) *Limits {
	return &Limits{
		MaxRuntime:     IntervalDuration(maxRun),
		StallTimeout:   OptionalDuration(stall),
		HardTimeout:    OptionalDuration(hardTO),
		AutoComplete:   auto,
		reapRetries:    int(retries),
		reapRetryDelay: IntervalDuration(retryDelay),
		exact:          true,
		maxRuntimeUs:   IntervalMicros(maxRun),
		stallTimeoutUs: optionalMicros(stall),
		hardTimeoutUs:  optionalMicros(hardTO),
	}
}

// internMax bounds the distinct strings one SnapshotScanner interns; past
// it, new values are allocated per row as ScanSnapshot does.
const internMax = 4096

// SnapshotScanner reads many rows of SnapshotColumns, one at a time, into
// Snapshots equal to ScanSnapshot's, for the loads of thousands of rows a
// pass makes. It allocates less per row: one set of scan targets serves
// every row (ScanSnapshot's escape to the heap on each call), the
// strings many rows repeat (type, status, worker, queue, failure reason)
// are allocated once per scanner, and the rows of one type whose
// job_types values are the same share one Limits, built once (with
// LimitsCache every row built its own first). A SnapshotScanner is not
// safe for concurrent use; use one per query.
type SnapshotScanner struct {
	id, typ, status, worker, queue, parent, reason pgtype.DriverBytes
	generation, firstGeneration                    int64
	started, updated                               pgtype.Timestamptz
	known, auto                                    bool
	maxRun, stall, hardTO, retryDelay              pgtype.Interval
	reapCount                                      int
	retries                                        int32
	dest                                           []any
	strs                                           map[string]string
	limits                                         map[string]scannedLimits
}

// scannedLimits is a job_types row as read and the Limits built from it.
type scannedLimits struct {
	maxRun, stall, hardTO, retryDelay pgtype.Interval
	auto                              bool
	retries                           int32
	limits                            *Limits
}

// NewSnapshotScanner returns a SnapshotScanner.
func NewSnapshotScanner() *SnapshotScanner {
	sc := &SnapshotScanner{strs: map[string]string{}, limits: map[string]scannedLimits{}}
	sc.dest = []any{&sc.id, &sc.typ, &sc.status, &sc.generation, &sc.worker, &sc.queue,
		&sc.parent, &sc.started, &sc.updated, &sc.reason,
		&sc.known, &sc.maxRun, &sc.stall, &sc.hardTO, &sc.auto, &sc.firstGeneration, &sc.reapCount, &sc.retries, &sc.retryDelay}
	return sc
}

// intern returns b as a string, the same string for the same bytes while
// the scanner holds fewer than internMax of them.
func (sc *SnapshotScanner) intern(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	if s, ok := sc.strs[string(b)]; ok {
		return s
	}
	s := string(b)
	if len(sc.strs) < internMax {
		sc.strs[s] = s
	}
	return s
}

// Scan reads the current row of rows (after rows.Next returned true), as
// ScanSnapshot does: an infinite started_at or updated_at does not fail
// the row, Snapshot.Unreadable says which. It returns the driver's scan
// error.
func (sc *SnapshotScanner) Scan(rows pgx.Rows) (Snapshot, error) {
	sc.started, sc.maxRun, sc.stall, sc.hardTO, sc.retryDelay = pgtype.Timestamptz{}, pgtype.Interval{}, pgtype.Interval{}, pgtype.Interval{}, pgtype.Interval{}
	if err := rows.Scan(sc.dest...); err != nil {
		return Snapshot{}, err
	}
	sn := Snapshot{
		ID: string(sc.id), Type: sc.intern(sc.typ), Status: sc.intern(sc.status), Generation: sc.generation,
		FirstGeneration: sc.firstGeneration, Worker: sc.intern(sc.worker), Queue: sc.intern(sc.queue),
		ParentID: string(sc.parent), FailureReason: sc.intern(sc.reason), updatedKey: sc.updated,
		reapCount: sc.reapCount,
	}
	finishSnapshot(&sn, sc.started)
	if sc.known {
		have, ok := sc.limits[sn.Type]
		if !ok || have.maxRun != sc.maxRun || have.stall != sc.stall || have.hardTO != sc.hardTO || have.auto != sc.auto ||
			have.retries != sc.retries || have.retryDelay != sc.retryDelay {
			have = scannedLimits{maxRun: sc.maxRun, stall: sc.stall, hardTO: sc.hardTO, auto: sc.auto,
				retries: sc.retries, retryDelay: sc.retryDelay,
				limits: newLimits(sc.maxRun, sc.stall, sc.hardTO, sc.auto, sc.retries, sc.retryDelay)}
			sc.limits[sn.Type] = have
		}
		sn.Limits = have.limits
	}
	return sn, nil
}

// IntervalDuration converts a PostgreSQL interval the way PostgreSQL
// compares intervals: a month is 30 days and a day is 24 hours.
//
// time.Duration ends at about 292 years; a longer interval saturates at
// MaxDuration (a negative one at -MaxDuration), so an absurd limit such as
// '500 years' reads as "never" instead of wrapping around to a negative
// duration.
func IntervalDuration(iv pgtype.Interval) time.Duration {
	const day = 24 * time.Hour
	days := int64(iv.Days) + 30*int64(iv.Months)
	// Bound-check in float64 (no overflow there); within the bound the
	// exact integer sum below cannot overflow. The bound sits a hair under
	// MaxDuration (at about 291.5 years), which no real limit approaches.
	approx := float64(iv.Microseconds)*float64(time.Microsecond) + float64(days)*float64(day)
	switch {
	case approx >= 9.2e18:
		return MaxDuration
	case approx <= -9.2e18:
		return -MaxDuration
	}
	return time.Duration(iv.Microseconds)*time.Microsecond + time.Duration(days)*day
}

// IntervalMicros converts a PostgreSQL interval to whole microseconds the
// way PostgreSQL compares intervals (a month is 30 days, a day 24 hours).
// Beyond what an int64 holds (about 292,000 years, longer than any
// difference of two PostgreSQL timestamps within 4713 BC to 294276 AD
// from today) it saturates at math.MaxInt64 (math.MinInt64 below).
func IntervalMicros(iv pgtype.Interval) int64 {
	const dayUs = int64(24 * time.Hour / time.Microsecond)
	days := int64(iv.Days) + 30*int64(iv.Months) // |days| < 2^37: no overflow
	switch {
	case days > math.MaxInt64/dayUs:
		return math.MaxInt64
	case days < math.MinInt64/dayUs:
		return math.MinInt64
	}
	return AddMicros(days*dayUs, iv.Microseconds)
}

// AddMicros returns a + b, saturated at math.MaxInt64 and math.MinInt64
// instead of wrapping around.
func AddMicros(a, b int64) int64 {
	sum := a + b
	switch {
	case a > 0 && b > 0 && sum < 0:
		return math.MaxInt64
	case a < 0 && b < 0 && sum >= 0:
		return math.MinInt64
	}
	return sum
}

func optionalMicros(iv pgtype.Interval) *int64 {
	if !iv.Valid {
		return nil
	}
	us := IntervalMicros(iv)
	return &us
}

// MaxDuration is the longest time.Duration, about 292 years.
const MaxDuration = time.Duration(math.MaxInt64)

// Interval converts d to a PostgreSQL interval parameter (microseconds).
func Interval(d time.Duration) pgtype.Interval {
	return pgtype.Interval{Microseconds: d.Microseconds(), Valid: true}
}

// OptionalDuration converts a nullable interval as IntervalDuration does:
// nil when NULL.
func OptionalDuration(iv pgtype.Interval) *time.Duration {
	if !iv.Valid {
		return nil
	}
	d := IntervalDuration(iv)
	return &d
}
