package pgcore

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Cascade holds one job type's follow-up statements. Each is SQL with named
// arguments taken from the job row: @job_id, @parent_id, @tenant_id, @type
// (NULL columns are passed as NULL).
type Cascade struct {
	// OnFailed runs in the transaction that fails a job: a reap, a lost-task
	// reap and Fail alike.
	OnFailed []string `yaml:"on_failed" koanf:"on_failed"`
	// OnCompleted runs in the transaction of Complete.
	OnCompleted []string `yaml:"on_completed" koanf:"on_completed"`
	// OnRequeued runs in the transaction of Requeue (`jobreaper requeue`),
	// where the product resets its own status of a job that runs again
	// (a parent's failed flag, an export's state). Its JSON form is left
	// out when empty, so that the digest of cascades without it (which
	// replicas compare for settings drift) is the one earlier versions
	// compute.
	OnRequeued []string `yaml:"on_requeued" koanf:"on_requeued" json:"OnRequeued,omitempty"`
}

// Cascades maps a job type name to its Cascade.
type Cascades map[string]Cascade

// Cascade hook names, as in the config file and in error messages.
const (
	HookOnFailed    = "on_failed"
	HookOnCompleted = "on_completed"
	HookOnRequeued  = "on_requeued"
)

// CascadeArgNames are the named arguments a cascade statement may use, in
// the order error messages list them.
var CascadeArgNames = []string{"job_id", "parent_id", "tenant_id", "type"}

// argCandidate finds what could be a named argument; pgx decides which of
// them really are (it skips string literals, quoted identifiers, comments
// and operators such as @>).
var argCandidate = regexp.MustCompile(`@([A-Za-z_][A-Za-z0-9_]*)`)

// CascadeStatement is one statement of one hook of one type.
type CascadeStatement struct {
	Type, Hook string
	N          int // 1-based
	SQL        string
}

// String names the statement for errors: cascade <hook> of type "<type>",
// statement <n>.
func (c CascadeStatement) String() string {
	return fmt.Sprintf("cascade %s of type %q, statement %d", c.Hook, c.Type, c.N)
}

// statements lists every statement in a stable order: types sorted, then
// on_failed, on_completed, on_requeued.
func (c Cascades) statements() []CascadeStatement {
	types := make([]string, 0, len(c))
	for typ := range c {
		types = append(types, typ)
	}
	slices.Sort(types)
	var out []CascadeStatement
	for _, typ := range types {
		for _, h := range []struct {
			name  string
			stmts []string
		}{{HookOnFailed, c[typ].OnFailed}, {HookOnCompleted, c[typ].OnCompleted}, {HookOnRequeued, c[typ].OnRequeued}} {
			for i, sql := range h.stmts {
				out = append(out, CascadeStatement{Type: typ, Hook: h.name, N: i + 1, SQL: sql})
			}
		}
	}
	return out
}

// Validate checks every statement without a database: it must not be empty,
// it must be valid UTF-8 without NUL bytes (PostgreSQL takes nothing else as
// statement text), and it may use no named argument but @job_id,
// @parent_id, @tenant_id and @type (pgx would pass an unknown one as NULL,
// silently). Each problem is
// reported in a sentence naming the type, the hook and the statement number;
// all problems are joined into one error, and each wraps ErrBadCascade.
func (c Cascades) Validate() error {
	var errs []error
	for typ := range c {
		if strings.TrimSpace(typ) == "" {
			errs = append(errs, fmt.Errorf("cascades: a job type name is empty: %w", ErrBadCascade))
		}
	}
	for _, st := range c.statements() {
		if strings.TrimSpace(st.SQL) == "" {
			errs = append(errs, fmt.Errorf("%s is empty: %w", st, ErrBadCascade))
			continue
		}
		// PostgreSQL refuses such text, and pgx's rewrite reads a named
		// argument up to and including the first invalid byte, so no
		// check of the arguments below could be trusted.
		if !utf8.ValidString(st.SQL) || strings.IndexByte(st.SQL, 0) >= 0 {
			errs = append(errs, fmt.Errorf("%s is not valid UTF-8 without NUL bytes (%q), which PostgreSQL cannot take as statement text: %w",
				st, shorten(strings.ToValidUTF8(st.SQL, "\ufffd"), 80), ErrBadCascade))
			continue
		}
		if unknown := unknownArgs(st.SQL); len(unknown) > 0 {
			errs = append(errs, fmt.Errorf("%s uses %s; only @%s are available: %w",
				st, strings.Join(unknown, ", "), strings.Join(CascadeArgNames, ", @"), ErrBadCascade))
		}
	}
	return errors.Join(errs...)
}

// unknownArgs returns the named arguments of sql, as "@name", that are not
// CascadeArgNames, in order of first appearance.
func unknownArgs(sql string) []string {
	var out []string
	for _, m := range argCandidate.FindAllStringSubmatch(sql, -1) {
		name := m[1]
		if slices.Contains(CascadeArgNames, name) || slices.Contains(out, "@"+name) {
			continue
		}
		if isNamedArg(sql, name) {
			out = append(out, "@"+name)
		}
	}
	return out
}

// isNamedArg asks pgx's own rewriting whether @name in sql is a placeholder.
func isNamedArg(sql, name string) bool {
	type marker struct{}
	// RewriteQuery ignores its context and connection.
	_, args, err := pgx.NamedArgs{name: marker{}}.RewriteQuery(context.TODO(), nil, sql, nil)
	return err == nil && slices.Contains(args, any(marker{}))
}

// PrepareCascades checks the Core's cascades at start: Validate, then each
// statement is parsed and planned by PostgreSQL (Parse and Describe, the
// named arguments rewritten to $n as at run time) inside a transaction that
// is rolled back, so a misspelt table or column fails here, naming the type,
// the hook and the statement, rather than at the first reap or completion.
//
// Each statement must also be one that PostgreSQL's own PREPARE accepts: a
// SELECT, INSERT, UPDATE, DELETE, MERGE or VALUES statement. PREPARE refuses
// transaction control (COMMIT, ROLLBACK, SAVEPOINT, ...), CALL and DO, which
// could end or escape the transaction that changes the job, so that a reap
// would look committed while its UPDATE was rolled back; this is the check,
// made by PostgreSQL's grammar rather than a parser of ours. Nothing is
// executed.
//
// Errors: the joined problems, each wrapping ErrBadCascade and naming the
// type, the hook, the statement (number and text) and the rule; or a
// wrapped driver error when PostgreSQL cannot be reached.
func (c *Core) PrepareCascades(ctx context.Context) error {
	if err := c.cascades.Validate(); err != nil {
		return fmt.Errorf("jobs.PrepareCascades: %w", err)
	}
	stmts := c.cascades.statements()
	if len(stmts) == 0 {
		return nil
	}
	ctx, done := c.Op(ctx, "PrepareCascades")
	tx, err := c.db.Begin(ctx)
	if err != nil {
		return done(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	var errs []error
	for _, st := range stmts {
		sql, _, err := CascadeArgs{}.Named().RewriteQuery(ctx, nil, st.SQL, nil)
		if err == nil {
			err = prepareIn(ctx, tx, sql)
		}
		if err != nil {
			if ctx.Err() != nil {
				return done(err)
			}
			if errors.Is(err, errNotPreparable) {
				errs = append(errs, fmt.Errorf("%s (%q) is refused: %w: %w", st, shorten(st.SQL, 80), err, ErrBadCascade))
				continue
			}
			errs = append(errs, fmt.Errorf("%s does not prepare against the database: %w: %w", st, ErrBadCascade, err))
		}
	}
	return done(errors.Join(errs...))
}

// errNotPreparable is the rule a statement breaks when PostgreSQL parses it
// but its PREPARE refuses it.
var errNotPreparable = errors.New("a cascade statement must be one PostgreSQL's PREPARE accepts " +
	"(SELECT, INSERT, UPDATE, DELETE, MERGE or VALUES); transaction control (COMMIT, ROLLBACK, SAVEPOINT, ...), " +
	"CALL and DO could end the transaction that changes the job")

// sqlStateSyntaxError is PostgreSQL's SQLSTATE 42601, syntax_error.
const sqlStateSyntaxError = "42601"

// cascadeCheckName names the prepared statement of the PREPARE check. It
// is deallocated at once: prepared statements outlive a rolled-back
// transaction.
const cascadeCheckName = "jobreaper_cascade_check"

// prepareIn checks sql inside a savepoint of tx, so that one failure does
// not abort the checks after it: Parse and Describe as an unnamed protocol
// statement (a misspelt table or column fails here), then PREPARE, whose
// grammar accepts only SELECT, INSERT, UPDATE, DELETE, MERGE and VALUES. A
// statement that parses but that PREPARE rejects as a syntax error returns
// an error wrapping errNotPreparable. Both go through the extended protocol,
// which refuses more than one statement in sql.
func prepareIn(ctx context.Context, tx pgx.Tx, sql string) error {
	sp, err := tx.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = sp.Rollback(ctx) }()
	conn := sp.Conn().PgConn()
	if _, err := conn.Prepare(ctx, "", sql, nil); err != nil {
		return err
	}
	_, err = conn.ExecParams(ctx, "PREPARE "+cascadeCheckName+" AS "+sql, nil, nil, nil, nil).Close()
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == sqlStateSyntaxError {
		return fmt.Errorf("%w (PostgreSQL: %s)", errNotPreparable, pgErr.Message)
	}
	if err != nil {
		return err
	}
	_, err = conn.ExecParams(ctx, "DEALLOCATE "+cascadeCheckName, nil, nil, nil, nil).Close()
	return err
}

// shorten returns s with its white space runs folded, cut to at most n
// bytes at a rune boundary, with "..." when cut.
func shorten(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "..."
}

// CascadeArgs are the values of the named arguments a cascade statement
// may use, from the job row ("" for a NULL parent_id or tenant_id).
type CascadeArgs struct {
	JobID, Type, ParentID, TenantID string
}

// Named returns a's values as pgx named arguments, "" passed as NULL.
func (a CascadeArgs) Named() pgx.NamedArgs {
	return pgx.NamedArgs{
		"job_id":    a.JobID,
		"type":      a.Type,
		"parent_id": Nullable(a.ParentID),
		"tenant_id": Nullable(a.TenantID),
	}
}

// Nullable returns s, or nil (SQL NULL) for "".
func Nullable(s string) any {
	if s == "" {
		return nil
	}
	return s
}

// RunFailed runs the on_failed cascade of a's type in tx, the transaction
// that fails the job (a worker's Fail, a reap, an operator's cancel). The
// error names the type and the statement.
func (c *Core) RunFailed(ctx context.Context, tx pgx.Tx, a CascadeArgs) error {
	return run(ctx, tx, a, HookOnFailed, c.cascades[a.Type].OnFailed)
}

// RunCompleted runs the on_completed cascade of a's type in tx, the
// transaction that completes the job. The error names the type and the
// statement.
func (c *Core) RunCompleted(ctx context.Context, tx pgx.Tx, a CascadeArgs) error {
	return run(ctx, tx, a, HookOnCompleted, c.cascades[a.Type].OnCompleted)
}

// RunRequeued runs the on_requeued cascade of a's type in tx, the
// transaction that requeues the job. The error names the type and the
// statement.
func (c *Core) RunRequeued(ctx context.Context, tx pgx.Tx, a CascadeArgs) error {
	return run(ctx, tx, a, HookOnRequeued, c.cascades[a.Type].OnRequeued)
}

func run(ctx context.Context, tx pgx.Tx, a CascadeArgs, kind string, stmts []string) error {
	for i, stmt := range stmts {
		if _, err := tx.Exec(ctx, stmt, a.Named()); err != nil {
			return fmt.Errorf("cascade %s of type %q, statement %d: %w", kind, a.Type, i+1, err)
		}
	}
	return nil
}
