// Package apilist lists the exported API of a package as its users see it,
// for the golden-list tests of jobs and queue: every exported name at the
// package's top level and, for an exported type (an alias included: its
// users see the aliased type's fields and methods), its exported fields and
// the exported methods of its method set. A name that appears or goes away
// changes the list, so each change of the public API is a reviewed diff of
// a committed file.
package apilist

import (
	"bufio"
	"bytes"
	"fmt"
	"go/importer"
	"go/token"
	"go/types"
	"io"
	"os"
	"os/exec"
	"slices"
	"strings"
)

// List returns the exported API of the package importPath, one entry per
// line in the form "<name> <kind>", sorted: kind is const, var, func or
// type for a top-level name, field or method for a member, written
// "<type>.<member>". It type-checks from the compiler's export data, which
// `go list -export` builds (from the build cache when it can), so the go
// command must be on PATH.
//
// Errors: the go command's failure, with its output; a package whose
// export data cannot be read.
func List(importPath string) ([]string, error) {
	cmd := exec.Command("go", "list", "-deps", "-export", "-f", "{{.ImportPath}}\t{{.Export}}", importPath)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go list -export %s: %w: %s", importPath, err, stderr.String())
	}
	exports := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		path, file, _ := strings.Cut(sc.Text(), "\t")
		exports[path] = file
	}
	imp := importer.ForCompiler(token.NewFileSet(), "gc", func(path string) (io.ReadCloser, error) {
		file, ok := exports[path]
		if !ok || file == "" {
			return nil, fmt.Errorf("no export data for %s", path)
		}
		return os.Open(file)
	})
	pkg, err := imp.Import(importPath)
	if err != nil {
		return nil, fmt.Errorf("reading the export data of %s: %w", importPath, err)
	}
	return Of(pkg), nil
}

// Of returns the exported API of pkg as List describes it.
func Of(pkg *types.Package) []string {
	var out []string
	scope := pkg.Scope()
	for _, name := range scope.Names() {
		obj := scope.Lookup(name)
		if !obj.Exported() {
			continue
		}
		switch obj := obj.(type) {
		case *types.Const:
			out = append(out, name+" const")
		case *types.Var:
			out = append(out, name+" var")
		case *types.Func:
			out = append(out, name+" func")
		case *types.TypeName:
			out = append(out, name+" type")
			out = append(out, members(name, obj.Type())...)
		}
	}
	slices.Sort(out)
	return out
}

// members lists the exported fields and methods of typ, named after the
// type as its package declares it (name).
func members(name string, typ types.Type) []string {
	var out []string
	if st, ok := typ.Underlying().(*types.Struct); ok {
		for f := range st.Fields() {
			if f.Exported() {
				out = append(out, name+"."+f.Name()+" field")
			}
		}
	}
	set := types.NewMethodSet(typ)
	if !types.IsInterface(typ) {
		set = types.NewMethodSet(types.NewPointer(typ))
	}
	for sel := range set.Methods() {
		if sel.Obj().Exported() {
			out = append(out, name+"."+sel.Obj().Name()+" method")
		}
	}
	return out
}

// Compare returns nil when the golden file at goldenPath lists exactly
// got (lines starting with "#" and blank lines are comments), and
// otherwise an error that shows the difference, "-" for a name the file
// lists that the package no longer has, "+" for a name the package has
// that the file does not list, and says how to accept the change. how is
// the command that rewrites the file.
func Compare(got []string, goldenPath, how string) error {
	raw, err := os.ReadFile(goldenPath)
	if err != nil {
		return fmt.Errorf("reading the golden API list: %w; write it with %s", err, how)
	}
	var want []string
	for line := range strings.Lines(string(raw)) {
		line = strings.TrimSpace(line)
		if line != "" && !strings.HasPrefix(line, "#") {
			want = append(want, line)
		}
	}
	var diff []string
	for _, w := range want {
		if !slices.Contains(got, w) {
			diff = append(diff, "- "+w)
		}
	}
	for _, g := range got {
		if !slices.Contains(want, g) {
			diff = append(diff, "+ "+g)
		}
	}
	if len(diff) == 0 {
		return nil
	}
	return fmt.Errorf("the exported API differs from %s (- listed there but gone, + new):\n%s\n"+
		"Every exported name is a promise to the package's users. If the change is meant, accept it with\n\t%s\n"+
		"and commit the file with the change, so that review sees it", goldenPath, strings.Join(diff, "\n"), how)
}

// Write writes got to goldenPath under header, a comment block whose
// lines Write prefixes with "# ".
func Write(got []string, goldenPath string, header []string) error {
	var b strings.Builder
	for _, h := range header {
		b.WriteString(strings.TrimRight("# "+h, " ") + "\n")
	}
	for _, g := range got {
		b.WriteString(g + "\n")
	}
	return os.WriteFile(goldenPath, []byte(b.String()), 0o644)
}

// Deps returns the packages importPath imports, directly or not, as `go
// list -deps` lists them (the package itself included). Errors: the go
// command's failure, with its output.
func Deps(importPath string) ([]string, error) {
	cmd := exec.Command("go", "list", "-deps", importPath)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go list -deps %s: %w: %s", importPath, err, stderr.String())
	}
	return strings.Fields(string(out)), nil
}
