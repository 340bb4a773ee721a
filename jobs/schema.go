package jobs

import (
	"context"
	"fmt"
	"io/fs"
	"path"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/jobreaper/jobreaper/internal/editdistance"
	"github.com/jobreaper/jobreaper/internal/idcheck"
	"github.com/jobreaper/jobreaper/internal/pgcore"
)

// ownTables are jobreaper's own tables, which every statement of this package
// names with the Store's schema ({schema}.jobs, ...). The start-up check
// requires each of them, and the migrations' version table, in the
// configured schema.
var ownTables = []string{"job_types", "jobs", "job_events", "job_batches"}

// CheckSchema is the start-up check of a Store's schema (WithSchema): it
// returns nil when the schema holds jobreaper's tables and every migration
// this binary ships. It writes nothing. The daemon runs the same check at
// start, and a worker process should call this once before it serves
// tasks, so that a wrong schema name or a forgotten migration stops it at
// start instead of failing every task.
// Behind a transaction-mode pooler every connection reports public as its
// current schema, so the check names the schema in each lookup
// (to_regclass('"jobreaper".jobs')) instead of asking the connection.
//
// Errors: ErrBadSchema for a name that is not a plain identifier (see
// Connect); ErrNotMigrated naming the schema, what is missing and
// `jobreaper migrate --schema <name>`; a wrapped driver error (timeout:
// OpTimeoutDefault or WithOpTimeout) when PostgreSQL fails.
func (s *Store) CheckSchema(ctx context.Context) error {
	ctx, done := s.core.Op(ctx, "CheckSchema")
	return done(checkSchema(ctx, s.core.DB(), s.core.Schema()))
}

// checkSchema looks up, by qualified name, jobreaper's tables and the
// version table in schema, then the latest applied migration.
func checkSchema(ctx context.Context, q pgcore.RowQuerier, schema string) error {
	if !idcheck.ValidSchema(schema) {
		return fmt.Errorf("schema %q: %w", schema, ErrBadSchema)
	}
	latest, err := latestVersion()
	if err != nil {
		return err
	}
	want := append(append([]string{}, ownTables...), SchemaVersionTable)
	var missing []string
	err = q.QueryRow(ctx, `SELECT coalesce(array_agg(t ORDER BY n), '{}')
  FROM unnest($2::text[]) WITH ORDINALITY AS w(t, n)
 WHERE to_regclass(format('%I.%I', $1::text, t)) IS NULL`, schema, want).Scan(&missing)
	if err != nil {
		return fmt.Errorf("looking up jobreaper's tables in schema %q: %w", schema, err)
	}
	fix := fmt.Sprintf("run `jobreaper migrate --schema %s` with the same database URL, or correct the schema name", schema)
	switch {
	case slices.Contains(missing, SchemaVersionTable) && len(missing) < len(want):
		// Tables of jobreaper's names without its version table are a
		// product's own (a jobs table, typically): migrate refuses them.
		var found []string
		for _, t := range want {
			if !slices.Contains(missing, t) {
				found = append(found, t)
			}
		}
		// The schema jobreaper was migrated into is the likelier answer
		// than migrating one more.
		if other := otherJobreaperSchema(ctx, q, schema); other != "" {
			return fmt.Errorf("schema %q holds tables named like jobreaper's (%s) that jobreaper did not create; schema %q of this database holds jobreaper's: did you mean --schema %s (JOBREAPER_SCHEMA)? jobreaper never uses a product's own tables: %w",
				schema, strings.Join(found, ", "), other, other, ErrNotMigrated)
		}
		return fmt.Errorf("schema %q holds tables named like jobreaper's (%s) that jobreaper did not create; give jobreaper a schema of its own: run `jobreaper migrate --schema jobreaper` and start with --schema jobreaper (JOBREAPER_SCHEMA): %w",
			schema, strings.Join(found, ", "), ErrNotMigrated)
	case len(missing) == len(want):
		if other := otherJobreaperSchema(ctx, q, schema); other != "" {
			return fmt.Errorf("schema %q has no jobreaper tables (this binary ships version %d); schema %q of this database holds them: did you mean --schema %s? If not, run `jobreaper migrate --schema %s` with the same database URL: %w",
				schema, latest, other, other, schema, ErrNotMigrated)
		}
		return fmt.Errorf("schema %q has no jobreaper tables (this binary ships version %d); %s: %w", schema, latest, fix, ErrNotMigrated)
	case len(missing) > 0:
		return fmt.Errorf("schema %q lacks jobreaper's tables %s; %s: %w", schema, strings.Join(missing, ", "), fix, ErrNotMigrated)
	}
	var current int64
	if err := q.QueryRow(ctx, `SELECT coalesce(max(version_id), 0) FROM `+
		pgx.Identifier{schema, SchemaVersionTable}.Sanitize()+` WHERE is_applied`).Scan(&current); err != nil {
		return fmt.Errorf("reading the migration version of schema %q: %w", schema, err)
	}
	if current < latest {
		return fmt.Errorf("schema %q is at version %d, this binary needs %d; run `jobreaper migrate --schema %s`: %w",
			schema, current, latest, schema, ErrNotMigrated)
	}
	return nil
}

// typoDistance is the largest edit distance at which one schema name is
// taken for a misspelling of another: a letter left out, added or changed
// (1), or two letters swapped (2).
const typoDistance = 2

// otherJobreaperSchema returns the schema of the database, other than
// schema, that a wrong --schema most likely meant: the only one holding
// jobreaper's tables (its version table and jobs), or else the one whose
// name is within typoDistance of schema (the nearest, then the first by
// name). It returns "" when there is none, or when the lookup fails: it
// only adds a hint to an error already on its way.
func otherJobreaperSchema(ctx context.Context, q pgcore.RowQuerier, schema string) string {
	var names []string
	err := q.QueryRow(ctx, `SELECT coalesce(array_agg(n.nspname::text ORDER BY n.nspname), '{}')
  FROM pg_catalog.pg_namespace n
 WHERE n.nspname <> $1
   AND EXISTS (SELECT FROM pg_catalog.pg_class c WHERE c.relnamespace = n.oid AND c.relname = $2 AND c.relkind IN ('r', 'p'))
   AND EXISTS (SELECT FROM pg_catalog.pg_class c WHERE c.relnamespace = n.oid AND c.relname = 'jobs' AND c.relkind IN ('r', 'p'))`,
		schema, SchemaVersionTable).Scan(&names)
	names = slices.DeleteFunc(names, func(n string) bool { return !idcheck.ValidSchema(n) })
	switch {
	case err != nil || len(names) == 0:
		return ""
	case len(names) == 1:
		return names[0]
	}
	best, bestD := "", typoDistance+1
	for _, n := range names {
		if d := editdistance.Between(schema, n); d < bestD {
			best, bestD = n, d
		}
	}
	return best
}

// latestVersion is the highest version among the embedded migrations.
func latestVersion() (int64, error) {
	files, err := fs.Glob(migrationFiles, "migrations/*.sql")
	if err != nil {
		return 0, err
	}
	var latest int64
	for _, name := range files {
		v, err := strconv.ParseInt(strings.SplitN(path.Base(name), "_", 2)[0], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("migration %s: the name must start with a version number", path.Base(name))
		}
		latest = max(latest, v)
	}
	return latest, nil
}
