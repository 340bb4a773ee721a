package jobs

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/jobreaper/jobreaper/internal/idcheck"
	"github.com/jobreaper/jobreaper/internal/redact"
)

// SchemaDefault is the PostgreSQL schema jobreaper's tables live in unless
// configured otherwise.
const SchemaDefault = "public"

// ErrBadSchema is returned by Connect, Migrate and Store.CheckSchema for a schema name that is not a plain
// PostgreSQL identifier (letters, digits, underscore; at most 63 bytes).
var ErrBadSchema = errors.New("schema name must be a plain identifier: letters, digits and underscore, at most 63 characters, not starting with a digit")

// Connect opens a pool to the database at databaseURL. It sends no
// setting as a startup parameter of its own except application_name
// (the URL's, or "jobreaper" when it sets none), which PgBouncer accepts;
// in particular it sets no search_path, which a transaction-mode pooler
// drops or refuses. jobreaper's statements name schema themselves (see
// WithSchema), so the pool works the same behind such a pooler. Unqualified
// names in operator cascades and in the caller's completion transactions
// are the product's: they resolve through the connection's own search_path
// (the server's or the role's default, usually "$user", public, or a
// search_path the URL sets, on a direct connection). It pings once so that
// a wrong URL or credentials fail here.
//
// Each of configure, when given, adjusts the pool's configuration before
// the pool is created (the daemon installs its connection-loss tracer there).
//
// Errors: ErrBadSchema for a malformed schema name; otherwise an error that
// names the host but never the password of databaseURL.
func Connect(ctx context.Context, databaseURL, schema string, configure ...func(*pgxpool.Config)) (*pgxpool.Pool, error) {
	if !idcheck.ValidSchema(schema) {
		return nil, fmt.Errorf("jobs.Connect: schema %q: %w", schema, ErrBadSchema)
	}
	cfg, err := pgxpool.ParseConfig(databaseURL)
	if err != nil {
		// pgx's parse errors can quote the URL; never pass them on.
		return nil, fmt.Errorf("jobs.Connect: database URL %s is not a valid PostgreSQL connection string", redact.URL(databaseURL))
	}
	if cfg.ConnConfig.RuntimeParams["application_name"] == "" {
		cfg.ConnConfig.RuntimeParams["application_name"] = "jobreaper"
	}
	for _, c := range configure {
		c(cfg)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("jobs.Connect: %s: %w", redact.URL(databaseURL), err)
	}
	pctx, cancel := context.WithTimeout(ctx, OpTimeoutDefault)
	defer cancel()
	if err := pool.Ping(pctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("jobs.Connect: cannot connect to PostgreSQL at %s: %w", redact.URL(databaseURL), redact.Error(err, cfg.ConnConfig.Password))
	}
	return pool, nil
}
