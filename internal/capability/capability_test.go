package capability

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// apiDoc is the page that lists every capability and every row of the
// field table for API users.
const apiDoc = "../../docs/api.md"

// section returns the lines of the markdown section whose heading is
// heading, up to the next heading of the same or a higher level.
func section(t *testing.T, doc, heading string) []string {
	t.Helper()
	lines := strings.Split(doc, "\n")
	level := strings.Count(strings.Fields(heading)[0], "#")
	for i, l := range lines {
		if l != heading {
			continue
		}
		var out []string
		for _, m := range lines[i+1:] {
			if h := strings.Fields(m); len(h) > 0 && strings.Trim(h[0], "#") == "" && len(h[0]) <= level {
				break
			}
			out = append(out, m)
		}
		return out
	}
	t.Fatalf("%s has no heading %q", apiDoc, heading)
	return nil
}

var codeSpan = regexp.MustCompile("`([^`]+)`")

// TestDocsListEveryCapability: every capability name this package defines
// (every string constant of its files) appears in the first column of
// docs/api.md's capability table, so that the docs cannot drift from the
// table the server advertises from.
func TestDocsListEveryCapability(t *testing.T) {
	b, err := os.ReadFile(apiDoc)
	if err != nil {
		t.Fatal(err)
	}
	documented := map[string]bool{}
	for _, l := range section(t, string(b), "## Capabilities") {
		cells := strings.Split(l, "|")
		if !strings.HasPrefix(l, "|") || len(cells) < 3 {
			continue
		}
		for _, m := range codeSpan.FindAllStringSubmatch(cells[1], -1) {
			documented[m[1]] = true
		}
	}
	names := constants(t)
	if len(names) < 20 {
		t.Fatalf("found %d capability constants, expected the whole table: %v", len(names), names)
	}
	for _, n := range names {
		if !documented[n] {
			t.Errorf("capability %q is not in the capability table of %s", n, apiDoc)
		}
	}
	for _, n := range Served(Features{Nodes: true, Enrollment: true, Network: true}) {
		if !documented[n] {
			t.Errorf("served capability %q is not in the capability table of %s", n, apiDoc)
		}
	}
}

// TestDocsListEveryField: every row of the field table is a row of
// docs/api.md's table of request fields.
func TestDocsListEveryField(t *testing.T) {
	b, err := os.ReadFile(apiDoc)
	if err != nil {
		t.Fatal(err)
	}
	rows := map[[3]string]bool{}
	for _, l := range section(t, string(b), "### Request fields that need their own capability") {
		cells := strings.Split(l, "|")
		if !strings.HasPrefix(l, "|") || len(cells) < 6 {
			continue
		}
		rows[[3]string{strings.TrimSpace(cells[1]), strings.Trim(strings.TrimSpace(cells[2]), "`"), strings.Trim(strings.TrimSpace(cells[4]), "`")}] = true
	}
	for _, f := range Fields() {
		method := f.Procedure[strings.LastIndexByte(f.Procedure, '/')+1:]
		if !rows[[3]string{method, f.Field, f.Capability}] {
			t.Errorf("the row %s %s → %s is not in the field table of %s", method, f.Field, f.Capability, apiDoc)
		}
	}
}

// constants returns the values of the string constants of this package's
// non-test files: the capability names.
func constants(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	fset := token.NewFileSet()
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			gd, ok := d.(*ast.GenDecl)
			if !ok || gd.Tok != token.CONST {
				continue
			}
			for _, spec := range gd.Specs {
				for _, v := range spec.(*ast.ValueSpec).Values {
					if lit, ok := v.(*ast.BasicLit); ok && lit.Kind == token.STRING {
						s, err := strconv.Unquote(lit.Value)
						if err != nil {
							t.Fatal(err)
						}
						out = append(out, s)
					}
				}
			}
		}
	}
	return out
}

// TestServed is the table of what each feature of a deployment adds: the
// network data path's names appear only with a node that serves networks.
func TestServed(t *testing.T) {
	network := []string{WorkspaceNetworkPolicy, EgressSOCKS5, EgressSOCKS5TLS, EgressUDP, ResolverUDP, ResolverTCP}
	for _, tc := range []struct {
		name     string
		f        Features
		has, not []string
	}{
		{"nothing", Features{}, []string{EgressManage, ResolverManage}, append([]string{WorkspaceCreate, NodeEnrollment}, network...)},
		{"nodes without networks", Features{Nodes: true}, []string{WorkspaceCreate, WorkspaceExec}, network},
		{"a node with networks", Features{Nodes: true, Network: true}, append([]string{WorkspaceCreate}, network...), nil},
		{"enrollment", Features{Enrollment: true}, []string{NodeEnrollment}, network},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Served(tc.f)
			if !slices.IsSorted(got) || len(slices.Compact(slices.Clone(got))) != len(got) {
				t.Errorf("Served(%+v) = %v, not sorted and unique", tc.f, got)
			}
			for _, n := range tc.has {
				if !slices.Contains(got, n) {
					t.Errorf("Served(%+v) lacks %q", tc.f, n)
				}
			}
			for _, n := range tc.not {
				if slices.Contains(got, n) {
					t.Errorf("Served(%+v) has %q", tc.f, n)
				}
			}
		})
	}
}
