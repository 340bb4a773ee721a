package jobs

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/jobreaper/jobreaper/internal/pgcore"
)

// ErrSchemaConflict is returned by Migrate when the target schema already
// holds tables (or indexes, or functions) with the names jobreaper's
// pending migrations would create, and they are not jobreaper's: the
// schema has no jobreaper_schema_version table recording them. Migrate
// then changes nothing. The usual cause is a product that has its own
// jobs table in public; the fix is a schema of jobreaper's own
// (`jobreaper migrate --schema jobreaper`).
var ErrSchemaConflict = errors.New("schema already has objects of the same names that are not jobreaper's")

// createdName matches the objects a migration creates: CREATE TABLE,
// [UNIQUE] INDEX, FUNCTION (OR REPLACE functions included), and the name
// that follows, optionally after IF NOT EXISTS.
var createdName = regexp.MustCompile(`(?im)^\s*CREATE\s+(?:OR\s+REPLACE\s+)?(TABLE|UNIQUE\s+INDEX|INDEX|FUNCTION)\s+(?:IF\s+NOT\s+EXISTS\s+)?("?[A-Za-z_][A-Za-z0-9_]*"?)`)

// migrationObject is one object an embedded migration creates.
type migrationObject struct {
	version int64
	kind    string // "relation" (table or index) or "function"
	name    string
}

// migrationObjects lists what each embedded migration's Up section
// creates, in file order.
func migrationObjects() ([]migrationObject, error) {
	files, err := fs.Glob(migrationFiles, "migrations/*.sql")
	if err != nil {
		return nil, err
	}
	var out []migrationObject
	for _, name := range files {
		version, err := strconv.ParseInt(strings.SplitN(path.Base(name), "_", 2)[0], 10, 64)
		if err != nil {
			return nil, fmt.Errorf("migration %s: the name must start with a version number", path.Base(name))
		}
		text, err := migrationFiles.ReadFile(name)
		if err != nil {
			return nil, err
		}
		up, _, err := splitMigration(string(text))
		if err != nil {
			return nil, fmt.Errorf("migration %s: %w", path.Base(name), err)
		}
		for _, m := range createdName.FindAllStringSubmatch(up, -1) {
			kind := "relation"
			if strings.EqualFold(m[1], "FUNCTION") {
				kind = "function"
			}
			out = append(out, migrationObject{version: version, kind: kind, name: strings.Trim(m[2], `"`)})
		}
	}
	return out, nil
}

// checkConflicts returns an error wrapping ErrSchemaConflict, naming the
// objects, when schema holds objects that a migration not yet applied
// would create. It writes nothing. A schema that does not exist has no
// conflicts.
func checkConflicts(ctx context.Context, q pgcore.RowQuerier, schema string) error {
	objects, err := migrationObjects()
	if err != nil {
		return err
	}
	var applied int64
	err = q.QueryRow(ctx, `SELECT CASE WHEN to_regclass($1) IS NULL THEN 0 ELSE -1 END`,
		pgx.Identifier{schema, SchemaVersionTable}.Sanitize()).Scan(&applied)
	if err != nil {
		return fmt.Errorf("looking up the version table of schema %q: %w", schema, err)
	}
	if applied < 0 {
		if err := q.QueryRow(ctx, `SELECT coalesce(max(version_id), 0) FROM `+
			pgx.Identifier{schema, SchemaVersionTable}.Sanitize()+` WHERE is_applied`).Scan(&applied); err != nil {
			return fmt.Errorf("reading the migration version of schema %q: %w", schema, err)
		}
	}
	var relations, functions []string
	for _, o := range objects {
		if o.version <= applied {
			continue
		}
		if o.kind == "function" {
			functions = append(functions, o.name)
		} else {
			relations = append(relations, o.name)
		}
	}
	var found []string
	err = q.QueryRow(ctx, `SELECT coalesce(array_agg(name ORDER BY name), '{}') FROM (
  SELECT c.relname::text AS name FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
   WHERE n.nspname = $1 AND c.relname = ANY($2::text[])
  UNION
  SELECT p.proname::text || '()' FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
   WHERE n.nspname = $1 AND p.proname = ANY($3::text[])) o`, schema, relations, functions).Scan(&found)
	if err != nil {
		return fmt.Errorf("looking for existing objects in schema %q: %w", schema, err)
	}
	if len(found) == 0 {
		return nil
	}
	suggest := "jobreaper"
	if schema == suggest {
		suggest = "jobreaper_queue"
	}
	own := "it has no " + SchemaVersionTable + " table, so they are not jobreaper's"
	if applied > 0 {
		own = fmt.Sprintf("its %s table records version %d, which does not create them", SchemaVersionTable, applied)
	}
	found = slices.Compact(found)
	return fmt.Errorf("schema %q already has %s (%s); nothing was changed: give jobreaper a schema of its own, for example `jobreaper migrate --schema %s` (and the same --schema for run and in the workers' jobs.WithSchema): %w",
		schema, strings.Join(found, ", "), own, suggest, ErrSchemaConflict)
}
