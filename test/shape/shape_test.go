// Package shape checks the sizes a reader can hold (issue 30, item 5):
// no non-test function over 100 lines, no type with more than 60
// methods, no package over 3,000 non-test lines; and what the master
// stands on (item 2: no runtime, no in-sandbox server under it). It reads
// the source, so the rules keep holding after the change that made them
// hold.
package shape

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

const (
	maxFuncLines    = 100
	maxMethods      = 60
	maxPackageLines = 3000
)

// root is the repository's root, two levels up from here.
func root(t *testing.T) string {
	t.Helper()
	dir, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "go.mod")); err != nil {
		t.Fatal(err)
	}
	return dir
}

// sources are the non-test Go files of our own code: cmd/, internal/,
// bench/ and api/ (third_party/ is generated from others' code).
func sources(t *testing.T) []string {
	t.Helper()
	var out []string
	for _, top := range []string{"api", "cmd", "internal", "bench"} {
		filepath.WalkDir(filepath.Join(root(t), top), func(p string, d os.DirEntry, err error) error {
			if err == nil && !d.IsDir() && strings.HasSuffix(p, ".go") && !strings.HasSuffix(p, "_test.go") {
				out = append(out, p)
			}
			return nil
		})
	}
	return out
}

func TestSizes(t *testing.T) {
	fset := token.NewFileSet()
	methods := map[string]int{}  // package dir + type → methods
	pkgLines := map[string]int{} // package dir → non-test lines
	var long []string
	for _, p := range sources(t) {
		f, err := parser.ParseFile(fset, p, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(root(t), p)
		dir := filepath.Dir(rel)
		pkgLines[dir] += fset.Position(f.End()).Line
		for _, d := range f.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok || fn.Body == nil {
				continue
			}
			lines := fset.Position(fn.End()).Line - fset.Position(fn.Pos()).Line
			if lines > maxFuncLines {
				long = append(long, fmt.Sprintf("%s:%d %s (%d lines)", rel, fset.Position(fn.Pos()).Line, fn.Name.Name, lines))
			}
			if fn.Recv != nil && len(fn.Recv.List) == 1 {
				methods[dir+" "+recvType(fn.Recv.List[0].Type)]++
			}
		}
	}
	sort.Strings(long)
	for _, l := range long {
		t.Errorf("a function over %d lines: %s", maxFuncLines, l)
	}
	for typ, n := range methods {
		if n > maxMethods {
			t.Errorf("a type with more than %d methods: %s has %d", maxMethods, typ, n)
		}
	}
	for dir, n := range pkgLines {
		if n > maxPackageLines {
			t.Errorf("a package over %d non-test lines: %s has %d", maxPackageLines, dir, n)
		}
	}
}

func recvType(e ast.Expr) string {
	switch x := e.(type) {
	case *ast.StarExpr:
		return recvType(x.X)
	case *ast.IndexExpr:
		return recvType(x.X)
	case *ast.IndexListExpr:
		return recvType(x.X)
	case *ast.Ident:
		return x.Name
	}
	return "?"
}

// TestMasterStandsOnNoRuntime: the master reaches its nodes through the
// seam (internal/nodeapi) and speaks to envd through api's constants; no
// runtime, cgroup code or in-sandbox server is built into it.
func TestMasterStandsOnNoRuntime(t *testing.T) {
	cmd := exec.Command("go", "list", "-deps", "./internal/master")
	cmd.Dir = root(t)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	for _, dep := range strings.Fields(string(out)) {
		for _, bad := range []string{"sandstorm/internal/sandbox/gvisor", "sandstorm/internal/cgroup", "sandstorm/internal/reclaim",
			"sandstorm/internal/envd", "github.com/creack/pty", "github.com/fsnotify/fsnotify"} {
			if dep == bad {
				t.Errorf("internal/master depends on %s", dep)
			}
		}
	}
}
