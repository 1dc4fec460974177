package api

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// route is one pattern the server registers on its mux.
type route struct {
	method, path string // method "" matches every method
	at           string // file:line
}

// serverRoutes reads the server package's source and returns every pattern
// passed as a string literal to a Handle or HandleFunc call: the routes
// http.ServeMux serves. Patterns built at run time are returned in computed
// (they cannot be checked here; the live tests reach them).
func serverRoutes(t *testing.T, dir string) (routes []route, computed []string) {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok || len(call.Args) != 2 {
				return true
			}
			sel, ok := call.Fun.(*ast.SelectorExpr)
			if !ok || (sel.Sel.Name != "Handle" && sel.Sel.Name != "HandleFunc") {
				return true
			}
			at := fset.Position(call.Pos()).String()
			lit, ok := call.Args[0].(*ast.BasicLit)
			if !ok || lit.Kind != token.STRING {
				computed = append(computed, at)
				return true
			}
			pattern, err := strconv.Unquote(lit.Value)
			if err != nil {
				t.Fatalf("%s: %v", at, err)
			}
			r := route{at: at, path: pattern}
			if m, p, ok := strings.Cut(pattern, " "); ok {
				r.method, r.path = m, strings.TrimSpace(p)
			}
			routes = append(routes, r)
			return true
		})
	}
	return routes, computed
}

// TestEveryRouteDescribed fails for a route the server registers that
// openapi.yaml does not describe, and for a described operation that no
// route serves (the demo page's, served by `greendot serve`'s static
// handler behind the catch-all, excepted).
func TestEveryRouteDescribed(t *testing.T) {
	doc := loadOpenAPI(t)
	routes, computed := serverRoutes(t, "../server")
	if len(routes) == 0 {
		t.Fatal("found no routes in ../server: has the mux moved?")
	}
	registered := map[string]bool{}
	for _, r := range routes {
		if r.path == "/" {
			continue // the catch-all: the 404 body and the demo page
		}
		item := doc.Paths.Value(r.path)
		if item == nil {
			t.Errorf("%s: the server serves %q, openapi.yaml does not describe the path", r.at, r.path)
			continue
		}
		if r.method == "" {
			continue // the same path with any other method: the 405
		}
		registered[r.method+" "+r.path] = true
		if item.GetOperation(r.method) == nil {
			t.Errorf("%s: the server serves %s %s, openapi.yaml does not describe the operation", r.at, r.method, r.path)
		}
	}
	var described []string
	for path, item := range doc.Paths.Map() {
		for method, op := range item.Operations() {
			if registered[method+" "+path] {
				continue
			}
			if len(op.Tags) == 1 && op.Tags[0] == "demo" {
				continue
			}
			described = append(described, method+" "+path)
		}
	}
	sort.Strings(described)
	for _, d := range described {
		t.Errorf("openapi.yaml describes %s, no route in ../server serves it", d)
	}
	t.Logf("%d routes registered with a literal pattern; computed patterns at %v (reached by the live tests)", len(routes), computed)
}
