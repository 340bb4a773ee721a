package pgcore

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
)

func TestCoreQNamesTheSchemaQuoted(t *testing.T) {
	t.Parallel()
	s := New(nil, Config{Schema: "JobReaper"})
	got := s.Q(`SELECT 1 FROM {schema}.jobs j JOIN {schema}.job_types t ON t.name = j.type`)
	want := `SELECT 1 FROM "JobReaper".jobs j JOIN "JobReaper".job_types t ON t.name = j.type`
	if got != want {
		t.Fatalf("Q = %s, want %s", got, want)
	}
	if def := New(nil, Config{Schema: SchemaDefault}).Q(`UPDATE {schema}.jobs`); def != `UPDATE "public".jobs` {
		t.Fatalf("default schema: Q = %s, want the public schema", def)
	}
}

func TestCoreQDoesNotAllocateOnceRendered(t *testing.T) {
	s := New(nil, Config{Schema: "jobreaper"})
	_ = s.Q(appendEventSQL)
	if n := testing.AllocsPerRun(100, func() { _ = s.Q(appendEventSQL) }); n != 0 {
		t.Fatalf("Q allocates %v times per call after the first, want 0", n)
	}
}

func TestCoreQConcurrentFirstCalls(t *testing.T) {
	t.Parallel()
	s := New(nil, Config{Schema: "jobreaper"})
	stmts := []string{appendEventSQL, `SELECT ` + SnapshotColumns + ` FROM {schema}.jobs j LEFT JOIN {schema}.job_types t ON t.name = j.type`,
		`UPDATE {schema}.jobs SET status = 'QUEUED'`, `INSERT INTO {schema}.job_events (job_id) VALUES ($1)`,
		`SELECT 1 FROM {schema}.leader_leases`, `DELETE FROM {schema}.job_batches`, `SELECT 1 FROM {schema}.reaper_holds`,
		`SELECT 1 FROM {schema}.reaper_outages`}
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for _, st := range stmts {
				if got := s.Q(st); strings.Contains(got, schemaPlaceholder) || !strings.Contains(got, `"jobreaper".`) {
					t.Errorf("Q left the placeholder or lost the schema: %s", got)
				}
			}
		}()
	}
	wg.Wait()
	if n := len(*s.rendered.Load()); n != len(stmts) {
		t.Fatalf("cache holds %d statements, want %d", n, len(stmts))
	}
}

// unqualified matches a statement naming one of jobreaper's tables
// without {schema}.
var unqualified = regexp.MustCompile(`\b(FROM|JOIN|INTO|UPDATE|TABLE)\s+(jobs|job_types|job_events|job_batches|job_past_lives|jobreaper_schema_version|leader_leases|reaper_holds|reaper_passes)\b`)

// statementDirs are the packages that send statements on jobreaper's
// tables: this one, the worker's (jobs) and the daemon's (pgstore).
var statementDirs = []string{".", "../../jobs", "../pgstore"}

// TestEveryStatementNamesTheSchema reads the source of statementDirs: no
// SQL text may name jobreaper's tables without {schema}., and every text
// that writes {schema} must reach PostgreSQL through Core.Q (directly in
// the call, or as a constant used inside Q(...)). Behind a transaction-mode
// pooler a statement that relies on search_path would silently reach
// another schema's tables, so this is checked for every statement, not
// only the ones the tests happen to run through PgBouncer.
func TestEveryStatementNamesTheSchema(t *testing.T) {
	t.Parallel()
	for _, dir := range statementDirs {
		t.Run(filepath.Base(dir), func(t *testing.T) {
			t.Parallel()
			checkStatementsIn(t, dir)
		})
	}
}

func checkStatementsIn(t *testing.T, dir string) {
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no Go files in %s (%v): the check reads the wrong directory", dir, err)
	}
	fset := token.NewFileSet()
	var parsed []*ast.File
	placeholderConsts := map[string]bool{}
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		abs, err := filepath.Abs(name)
		if err != nil {
			t.Fatal(err)
		}
		f, err := parser.ParseFile(fset, abs, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		parsed = append(parsed, f)
		ast.Inspect(f, func(n ast.Node) bool {
			if lit, ok := n.(*ast.BasicLit); ok && lit.Kind == token.STRING && unqualified.MatchString(lit.Value) {
				t.Errorf("%s: SQL names jobreaper's table without {schema}.: %s", fset.Position(lit.Pos()), unqualified.FindString(lit.Value))
			}
			return true
		})
		ast.Inspect(f, func(n ast.Node) bool {
			if vs, ok := n.(*ast.ValueSpec); ok {
				for i, v := range vs.Values {
					if mentionsPlaceholder(v) {
						placeholderConsts[vs.Names[i].Name] = true
					}
				}
				return false // the declaration itself is not a use
			}
			return true
		})
	}
	if len(placeholderConsts) == 0 {
		t.Fatal("found no statement constant writing {schema}: the check reads the wrong files")
	}
	for _, f := range parsed {
		var stack []ast.Node
		ast.Inspect(f, func(n ast.Node) bool {
			if n == nil {
				stack = stack[:len(stack)-1]
				return true
			}
			if _, ok := n.(*ast.GenDecl); ok && len(stack) == 1 {
				return false // package-level declarations: checked where used
			}
			stack = append(stack, n)
			use := false
			switch n := n.(type) {
			case *ast.BasicLit:
				use = n.Kind == token.STRING && strings.Contains(n.Value, schemaPlaceholder)
			case *ast.Ident:
				use = placeholderConsts[n.Name]
			}
			if use && !insideQ(stack) && !strings.HasSuffix(fset.Position(n.Pos()).Filename, filepath.Join("internal", "pgcore", "core.go")) {
				t.Errorf("%s: a statement writing {schema} is sent without Core.Q", fset.Position(n.Pos()))
			}
			return true
		})
	}
}

func mentionsPlaceholder(e ast.Expr) bool {
	found := false
	ast.Inspect(e, func(n ast.Node) bool {
		if lit, ok := n.(*ast.BasicLit); ok && strings.Contains(lit.Value, schemaPlaceholder) {
			found = true
		}
		return !found
	})
	return found
}

// insideQ reports whether the innermost call around the node on top of
// stack is a call of a method named Q.
func insideQ(stack []ast.Node) bool {
	for i := len(stack) - 2; i >= 0; i-- {
		if call, ok := stack[i].(*ast.CallExpr); ok {
			sel, ok := call.Fun.(*ast.SelectorExpr)
			return ok && sel.Sel.Name == "Q"
		}
	}
	return false
}
