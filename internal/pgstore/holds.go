package pgstore

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/jobreaper/jobreaper/internal/pgcore"
)

// Hold is a row of reaper_holds: a stall-storm hold on some queues. While
// it is in effect (InEffect) the reaper reaps no stalled job of its
// queues; the first pass after it is over reaps those still stalled
// without the storm check, and records the queues it did that for
// (Drained).
type Hold struct {
	ID int64
	// Queues are the queues held, sorted; Types the job types of the
	// stalled jobs held at the start, sorted.
	Queues, Types []string
	// Held is how many stalled jobs the starting pass held; Judged how
	// many active tasks of those queues it judged.
	Held, Judged int
	// Tripped says which limit tripped, with its values.
	Tripped string
	// StartedAt and Until are on the database clock.
	StartedAt, Until time.Time
	// ReleasedAt is nil unless an operator released the hold; ReleasedBy
	// and Reason are then who (user@host) and why.
	ReleasedAt         *time.Time
	ReleasedBy, Reason string
	// Drained lists the queues whose first pass after the hold's end has
	// run, sorted.
	Drained []string
}

// InEffect reports whether the hold holds its queues at now (a database
// clock reading): not released, and now before Until.
func (h Hold) InEffect(now time.Time) bool {
	return h.ReleasedAt == nil && now.Before(h.Until)
}

// StartHoldParams describe a hold to record.
type StartHoldParams struct {
	// Queues and Types are stored sorted, each once; Queues must not be
	// empty.
	Queues, Types []string
	Held, Judged  int
	Tripped       string
	// For is how long the hold lasts from the database's now(); not
	// negative.
	For time.Duration
}

const holdColumns = `id, queues, types, held, judged, tripped, started_at, until, released_at,
       coalesce(released_by, ''), coalesce(reason, ''), drained`

const startHoldSQL = `
INSERT INTO {schema}.reaper_holds (queues, types, held, judged, tripped, started_at, until)
VALUES (@queues::text[], @types::text[], @held, @judged, @tripped, now(), now() + @for::interval)
RETURNING ` + holdColumns

// StartHold records a hold on p.Queues lasting p.For from now(), and
// returns it. Errors: pgcore.ErrInvalidArgument for no queue or a negative
// duration; a wrapped driver error when PostgreSQL fails (nothing
// recorded).
func (s *Store) StartHold(ctx context.Context, p StartHoldParams) (Hold, error) {
	if len(p.Queues) == 0 || p.For < 0 {
		return Hold{}, fmt.Errorf("jobs.StartHold: %w: a hold needs a queue and a duration of 0 or more (queues %d, for %s)",
			pgcore.ErrInvalidArgument, len(p.Queues), p.For)
	}
	ctx, done := s.core.Op(ctx, "StartHold")
	rows, err := s.core.DB().Query(ctx, s.core.Q(startHoldSQL), pgx.NamedArgs{
		"queues": sortedSet(p.Queues), "types": sortedSet(p.Types), "held": p.Held, "judged": p.Judged,
		"tripped": p.Tripped, "for": pgcore.Interval(p.For),
	})
	if err != nil {
		return Hold{}, done(err)
	}
	h, err := pgx.CollectExactlyOneRow(rows, scanHold)
	return h, done(err)
}

// openHoldsSQL reads the holds not drained yet that name one of @queues:
// few rows, through reaper_holds_open_idx or a scan of a small table.
const openHoldsSQL = `
SELECT ` + holdColumns + `
  FROM {schema}.reaper_holds
 WHERE drained_at IS NULL AND queues && @queues::text[]
 ORDER BY id`

// OpenHolds returns, in one statement, the holds that name one of queues
// and whose queues have not all been drained: those in effect and those
// whose end a pass has still to act on, in ID order. It returns a wrapped
// driver error when PostgreSQL fails.
func (s *Store) OpenHolds(ctx context.Context, queues []string) ([]Hold, error) {
	ctx, done := s.core.Op(ctx, "OpenHolds")
	if queues == nil {
		queues = []string{}
	}
	rows, err := s.core.DB().Query(ctx, s.core.Q(openHoldsSQL), pgx.NamedArgs{"queues": queues})
	if err != nil {
		return nil, done(err)
	}
	holds, err := pgx.CollectRows(rows, scanHold)
	return holds, done(err)
}

// drainHoldsSQL adds, to each hold of @ids that is over at @now, those of
// @queues it names to drained, and sets drained_at once every queue of
// the hold is there.
const drainHoldsSQL = `
UPDATE {schema}.reaper_holds h
   SET drained = ARRAY(SELECT DISTINCT q FROM unnest(h.drained || h.queues) AS q
                        WHERE q = ANY(h.drained) OR q = ANY(@queues::text[]) ORDER BY q),
       drained_at = CASE WHEN h.queues <@ (h.drained || @queues::text[]) THEN now() END
 WHERE h.id = ANY(@ids::int8[]) AND h.drained_at IS NULL
   AND (h.released_at IS NOT NULL OR h.until <= @now)`

// DrainHolds records that the first pass after the end of the holds ids
// (over at now, a database clock reading) has reaped the stalled jobs of
// queues without the storm check: later passes check those queues again.
// A hold in effect at now is left as it is. It returns a wrapped driver
// error when PostgreSQL fails (nothing recorded: the next pass is again
// the first after).
func (s *Store) DrainHolds(ctx context.Context, ids []int64, queues []string, now time.Time) error {
	if len(ids) == 0 || len(queues) == 0 {
		return nil
	}
	ctx, done := s.core.Op(ctx, "DrainHolds")
	_, err := s.core.DB().Exec(ctx, s.core.Q(drainHoldsSQL), pgx.NamedArgs{"ids": ids, "queues": queues, "now": now})
	return done(err)
}

// ReleaseHoldsParams select the holds an operator ends.
type ReleaseHoldsParams struct {
	// Queues: the holds that name one of them are released (each whole,
	// for every queue it names); empty: every hold in effect.
	Queues []string
	// By names the operator (user@host); Reason says why (required, see
	// CheckOperatorReason).
	By, Reason string
}

const releaseHoldsSQL = `
UPDATE {schema}.reaper_holds
   SET released_at = now(), released_by = @by, reason = @reason
 WHERE released_at IS NULL AND until > now() AND drained_at IS NULL
   AND (cardinality(@queues::text[]) = 0 OR queues && @queues::text[])
RETURNING ` + holdColumns

// ReleaseHolds ends at once, on the database clock, the holds in effect
// that p selects, and returns them in ID order (none when no hold was in
// effect). The next pass of each of their queues reaps the jobs still
// stalled there. Errors: pgcore.ErrInvalidArgument for a reason
// CheckOperatorReason refuses; a wrapped driver error when PostgreSQL
// fails (nothing released).
func (s *Store) ReleaseHolds(ctx context.Context, p ReleaseHoldsParams) ([]Hold, error) {
	if err := CheckOperatorReason(p.Reason); err != nil {
		return nil, fmt.Errorf("jobs.ReleaseHolds: %w", err)
	}
	ctx, done := s.core.Op(ctx, "ReleaseHolds")
	queues := p.Queues
	if queues == nil {
		queues = []string{}
	}
	rows, err := s.core.DB().Query(ctx, s.core.Q(releaseHoldsSQL), pgx.NamedArgs{"queues": queues, "by": p.By, "reason": p.Reason})
	if err != nil {
		return nil, done(err)
	}
	holds, err := pgx.CollectRows(rows, scanHold)
	slices.SortFunc(holds, func(a, b Hold) int { return cmp.Compare(a.ID, b.ID) })
	return holds, done(err)
}

func scanHold(row pgx.CollectableRow) (Hold, error) {
	var h Hold
	err := row.Scan(&h.ID, &h.Queues, &h.Types, &h.Held, &h.Judged, &h.Tripped, &h.StartedAt, &h.Until,
		&h.ReleasedAt, &h.ReleasedBy, &h.Reason, &h.Drained)
	return h, err
}

// sortedSet returns names sorted, each once, never nil.
func sortedSet(names []string) []string {
	out := slices.Clone(names)
	slices.Sort(out)
	out = slices.Compact(out)
	if out == nil {
		out = []string{}
	}
	return out
}
