package apilist

import (
	"go/ast"
	"go/parser"
	"go/token"
	"go/types"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// check type-checks src as package p.
func check(t *testing.T, src string) *types.Package {
	t.Helper()
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "p.go", src, 0)
	if err != nil {
		t.Fatal(err)
	}
	pkg, err := (&types.Config{}).Check("p", fset, []*ast.File{f}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return pkg
}

func TestOfListsWhatUsersSee(t *testing.T) {
	pkg := check(t, `package p
type inner struct{ A int; b int }
func (inner) M() {}
func (*inner) P() {}
func (inner) q() {}
type Alias = inner
type Iface interface{ Get() int; set() }
type Opt func()
const C = 1
var V, w = 1, 2
func F() {}
func g() {}
`)
	want := []string{
		"Alias type", "Alias.A field", "Alias.M method", "Alias.P method",
		"C const", "F func", "Iface type", "Iface.Get method", "Opt type", "V var",
	}
	if got := Of(pkg); !slices.Equal(got, want) {
		t.Fatalf("Of = %q, want %q", got, want)
	}
}

func TestCompareShowsTheDifferenceAndTheFix(t *testing.T) {
	path := filepath.Join(t.TempDir(), "api.golden")
	if err := Write([]string{"A func", "B type"}, path, []string{"header"}); err != nil {
		t.Fatal(err)
	}
	if err := Compare([]string{"A func", "B type"}, path, "go test -update"); err != nil {
		t.Fatalf("Compare of the same list = %v, want nil", err)
	}
	raw, _ := os.ReadFile(path)
	if !strings.HasPrefix(string(raw), "# header\n") {
		t.Fatalf("file = %q, want the header first", raw)
	}
	err := Compare([]string{"A func", "C var"}, path, "go test -update")
	if err == nil || !strings.Contains(err.Error(), "- B type") || !strings.Contains(err.Error(), "+ C var") ||
		!strings.Contains(err.Error(), "go test -update") {
		t.Fatalf("Compare with a name gone and one new = %v, want both and the command", err)
	}
}
