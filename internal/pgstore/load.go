package pgstore

import (
	"context"

	"github.com/jackc/pgx/v5"

	"github.com/jobreaper/jobreaper/internal/pgcore"
)

// LoadBatchSize is how many job IDs one LoadForTasks query names (= ANY($1));
// larger sets are split so that no single statement grows without bound.
// At 10,000 IDs a batch costs tens of milliseconds, and the reaper holds
// one batch of rows at a time.
const LoadBatchSize = 10000

// loadSQL reads rows and limits by ID, through the primary key (it runs
// behind pinPlansSQL: a custom plan without sequential scans).
const loadSQL = `SELECT ` + pgcore.SnapshotColumns + `
  FROM {schema}.jobs j LEFT JOIN {schema}.job_types t ON t.name = j.type
 WHERE j.id = ANY(@ids::text[])`

// LoadForTasks reads the job rows with the given IDs and their type limits,
// in queries of at most LoadBatchSize IDs each (never one query per task).
// IDs without a row are absent from the result map. The reaper calls it
// once per batch, so that it holds one batch of rows at a time. It returns
// a wrapped driver error when PostgreSQL fails (no partial result).
func (s *Store) LoadForTasks(ctx context.Context, ids []string) (map[string]pgcore.Snapshot, error) {
	out := make(map[string]pgcore.Snapshot, len(ids))
	for start := 0; start < len(ids); start += LoadBatchSize {
		end := min(start+LoadBatchSize, len(ids))
		if err := s.loadBatch(ctx, ids[start:end], out); err != nil {
			return nil, err
		}
	}
	return out, nil
}

func (s *Store) loadBatch(ctx context.Context, ids []string, out map[string]pgcore.Snapshot) error {
	ctx, done := s.core.Op(ctx, "LoadForTasks")
	rows, _, err := pgcore.PinnedQuery(ctx, s.core.DB(), s.core.Q(loadSQL), pgx.NamedArgs{"ids": ids})
	if err != nil {
		return done(err)
	}
	defer rows.Close()
	// One scanner per batch: its scan targets, interned strings and
	// shared Limits serve every row (ScanSnapshot allocated about 15
	// objects per row, the load's largest share of the pass's CPU).
	sc := pgcore.NewSnapshotScanner()
	for rows.Next() {
		sn, err := sc.Scan(rows)
		if err != nil {
			return done(err)
		}
		out[sn.ID] = sn
	}
	return done(rows.Err())
}
