package jobs

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

func TestStoreQNamesTheSchemaQuoted(t *testing.T) {
	t.Parallel()
	s := NewStore(nil, WithSchema("JobReaper"))
	got := s.q(`SELECT 1 FROM {schema}.jobs j JOIN {schema}.job_types t ON t.name = j.type`)
	want := `SELECT 1 FROM "JobReaper".jobs j JOIN "JobReaper".job_types t ON t.name = j.type`
	if got != want {
		t.Fatalf("q = %s, want %s", got, want)
	}
	if def := NewStore(nil).q(`UPDATE {schema}.jobs`); def != `UPDATE "public".jobs` {
		t.Fatalf("default schema: q = %s, want the public schema", def)
	}
}

func TestStoreQDoesNotAllocateOnceRendered(t *testing.T) {
	s := NewStore(nil, WithSchema("jobreaper"))
	_ = s.q(heartbeatSQL)
	if n := testing.AllocsPerRun(100, func() { _ = s.q(heartbeatSQL) }); n != 0 {
		t.Fatalf("q allocates %v times per call after the first, want 0", n)
	}
}

func TestStoreQConcurrentFirstCalls(t *testing.T) {
	t.Parallel()
	s := NewStore(nil, WithSchema("jobreaper"))
	stmts := []string{claimSQL, heartbeatSQL, completeSQL, failSQL, reapBatchSQL, readStateSQL, appendEventSQL, lateResultSQL}
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for _, st := range stmts {
				if got := s.q(st); strings.Contains(got, schemaPlaceholder) || !strings.Contains(got, `"jobreaper".`) {
					t.Errorf("q left the placeholder or lost the schema: %s", got)
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
var unqualified = regexp.MustCompile(`\b(FROM|JOIN|INTO|UPDATE|TABLE)\s+(jobs|job_types|job_events|job_batches|job_past_lives|jobreaper_schema_version|leader_leases|reaper_holds)\b`)

// TestEveryStatementNamesTheSchema reads this package's source: no SQL
// text may name jobreaper's tables without {schema}., and every text that
// writes {schema} must reach PostgreSQL through Store.q (directly in the
// call, or as a constant used inside q(...)). Behind a transaction-mode
// pooler a statement that relies on search_path would silently reach
// another schema's tables, so this is checked for every statement, not
// only the ones the tests happen to run through PgBouncer.
func TestEveryStatementNamesTheSchema(t *testing.T) {
	t.Parallel()
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	var parsed []*ast.File
	placeholderConsts := map[string]bool{}
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.SkipObjectResolution)
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
			if use && !insideQ(stack) && !strings.HasSuffix(fset.Position(n.Pos()).Filename, "store.go") {
				t.Errorf("%s: a statement writing {schema} is sent without Store.q", fset.Position(n.Pos()))
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
// stack is a call of a method named q.
func insideQ(stack []ast.Node) bool {
	for i := len(stack) - 2; i >= 0; i-- {
		if call, ok := stack[i].(*ast.CallExpr); ok {
			sel, ok := call.Fun.(*ast.SelectorExpr)
			return ok && sel.Sel.Name == "q"
		}
	}
	return false
}
