// Package layout holds the guards that keep the repository's shape: every
// package says what it is for, documents cite only files that exist, and the
// programs that must stay small (the SDK, the guest that runs inside every
// workspace) do not pull in the server.
package layout

import (
	"encoding/json"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/kibotos/kibotos"

// root is the repository root.
func root(t *testing.T) string {
	t.Helper()
	dir, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "go.mod")); err != nil {
		t.Fatalf("no go.mod at %s: %v", dir, err)
	}
	return dir
}

// TestPackagesDocumented: every package of the module but the generated ones
// has a package comment (in a test file for test-only packages).
func TestPackagesDocumented(t *testing.T) {
	base := root(t)
	err := filepath.WalkDir(base, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			return nil
		}
		rel, _ := filepath.Rel(base, path)
		name := d.Name()
		if rel != "." && (strings.HasPrefix(name, ".") || name == "testdata" || name == "gen" || name == "bin" || name == "tools") {
			return filepath.SkipDir
		}
		pkgs, err := parser.ParseDir(token.NewFileSet(), path, nil, parser.ParseComments|parser.PackageClauseOnly)
		if err != nil {
			return err
		}
		for _, p := range pkgs {
			documented := false
			for _, f := range p.Files {
				if f.Doc != nil && strings.TrimSpace(f.Doc.Text()) != "" {
					documented = true
				}
			}
			if !documented && !strings.HasSuffix(p.Name, "_test") {
				t.Errorf("package %s (%s) has no package comment saying what it is for", p.Name, rel)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

var (
	// docRef is a Markdown document named in a text.
	docRef = regexp.MustCompile(`(?:^|[^\w./-])((?:\.\./)*(?:[\w.-]+/)*[\w-]+\.md)\b`)
	// pathRef is a repository path with a directory and an extension.
	pathRef = regexp.MustCompile(`(?:^|[^\w./-])((?:internal|cmd|bench|test|docs|scripts|proto|tools)/(?:[\w.-]+/)*[\w-]+\.(?:go|proto|sh|md|json|yaml))\b`)
)

// TestDocumentReferences: the documents and paths that docs and code cite
// exist in the repository (relative to its root or to the citing file). A
// document of somewhere else (the specification this project started from)
// is no reference a reader can follow here.
func TestDocumentReferences(t *testing.T) {
	base := root(t)
	out, err := exec.Command("git", "-C", base, "ls-files", "--cached", "--others", "--exclude-standard").Output()
	if err != nil {
		t.Skipf("git ls-files: %v", err)
	}
	// Names used as examples or created by the code that cites them.
	examples := map[string]bool{"FILE.md": true}
	for _, f := range strings.Fields(string(out)) {
		if strings.HasPrefix(f, "gen/") || strings.Contains(f, "/testdata/") || strings.HasPrefix(f, "bench/results/") ||
			!(strings.HasSuffix(f, ".go") || strings.HasSuffix(f, ".md")) {
			continue
		}
		data, err := os.ReadFile(filepath.Join(base, f))
		if err != nil {
			if os.IsNotExist(err) {
				continue // deleted in the work tree
			}
			t.Fatal(err)
		}
		text := string(data)
		if strings.HasSuffix(f, ".go") {
			text = comments(text)
		}
		var refs []string
		for _, m := range docRef.FindAllStringSubmatch(text, -1) {
			refs = append(refs, m[1])
		}
		for _, m := range pathRef.FindAllStringSubmatch(text, -1) {
			refs = append(refs, m[1])
		}
		for _, ref := range refs {
			if examples[ref] || strings.Contains(ref, "/path/to/") {
				continue
			}
			if exists(filepath.Join(base, ref)) || exists(filepath.Join(base, filepath.Dir(f), ref)) {
				continue
			}
			t.Errorf("%s cites %s, which is not in the repository", f, ref)
		}
	}
}

// comments returns the // comment lines of Go source: file names in code
// are the code's business (and its tests'), names in comments are the
// reader's.
func comments(src string) string {
	var b strings.Builder
	for _, line := range strings.Split(src, "\n") {
		if l := strings.TrimSpace(line); strings.HasPrefix(l, "//") {
			b.WriteString(l)
			b.WriteByte('\n')
		}
	}
	return b.String()
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// testHelpers are the packages that only tests may import.
var testHelpers = []string{
	module + "/internal/store/storetest",
	module + "/internal/store/postgres/pgtest",
	module + "/internal/ctrltest",
	module + "/internal/node/agent/agenttest",
	"testing",
}

// TestDependencies: the SDK and the guest stay free of the server, and no
// production binary carries test helpers. The
// guest runs inside every workspace, as PID 1, under the workspace's memory
// limit: no SQL driver, store, CLI, metrics or control-plane code.
func TestDependencies(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go list")
	}
	base := root(t)
	server := []string{
		module + "/internal/store",
		module + "/internal/ctrl",
		module + "/internal/reconciler",
		module + "/internal/api",
		"modernc.org/sqlite",
		"github.com/jackc/pgx/v5",
		"github.com/prometheus/client_golang",
	}
	for _, tc := range []struct {
		pkg       string
		forbidden []string
	}{
		{module, append(slices.Clone(server), "gvisor.dev/gvisor")},
		// The guest is also the init shim: of the node's code it may use
		// only sandbox/initshim and sandbox/seccomp.
		{module + "/cmd/kibotos-guest", append(slices.Clone(server),
			"database/sql",
			module+"/internal/cli",
			module+"/internal/node/agent",
			module+"/internal/node/daemon",
			module+"/internal/node/enroll",
			module+"/internal/node/template",
			module+"/internal/pki",
			"github.com/spf13/cobra",
			"gvisor.dev/gvisor",
		)},
		// Production binaries carry no test helpers.
		{module + "/cmd/kibotos-ctrl", testHelpers},
		{module + "/cmd/kibotos-node", testHelpers},
		{module + "/cmd/kibo", append(slices.Clone(testHelpers), server...)},
	} {
		t.Run(strings.TrimPrefix(tc.pkg, module), func(t *testing.T) {
			deps := goList(t, base, "-deps", "-f", "{{.ImportPath}}", tc.pkg)
			if len(deps) == 0 {
				t.Fatal("go list -deps listed nothing")
			}
			for _, dep := range deps {
				if tc.pkg == module+"/cmd/kibotos-guest" && dep == module+"/internal/node/sandbox" {
					t.Errorf("%s depends on the node's sandbox runtime", tc.pkg)
				}
				for _, f := range tc.forbidden {
					if dep == f || strings.HasPrefix(dep, f+"/") {
						t.Errorf("%s depends on %s (forbidden: %s)", tc.pkg, dep, f)
					}
				}
			}
		})
	}
	// The forbidden names are real: a package of this module, a module of
	// its build list, a standard package, or (gVisor) the module path the
	// network issue brings in. A misspelt entry would forbid nothing.
	modules := goList(t, base, "-m", "all")
	known := map[string]bool{"gvisor.dev/gvisor": true, "database/sql": true}
	for _, line := range modules {
		known[line] = true
	}
	for _, name := range append(server, module+"/internal/cli", module+"/internal/node/agent", module+"/internal/pki", "github.com/spf13/cobra") {
		if known[name] {
			continue
		}
		if strings.HasPrefix(name, module+"/") && exists(filepath.Join(base, strings.TrimPrefix(name, module+"/"))) {
			continue
		}
		t.Errorf("forbidden dependency %q is neither a package of this module nor a module of its build list", name)
	}
}

// goList runs go list in dir and returns its output's words; for -m all,
// the module paths.
func goList(t *testing.T, dir string, args ...string) []string {
	t.Helper()
	if args[0] == "-m" {
		args = append([]string{"-m", "-json"}, args[1:]...)
	}
	cmd := exec.Command("go", append([]string{"list"}, args...)...)
	cmd.Dir = dir
	out, err := cmd.Output()
	if err != nil {
		var stderr string
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = string(ee.Stderr)
		}
		t.Fatalf("go list %v: %v\n%s", args, err, stderr)
	}
	if args[0] != "-m" {
		return strings.Fields(string(out))
	}
	var paths []string
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for dec.More() {
		var m struct{ Path string }
		if err := dec.Decode(&m); err != nil {
			t.Fatal(err)
		}
		paths = append(paths, m.Path)
	}
	return paths
}

// TestArchitectureListsEveryPackage: docs/architecture.md's Layout names
// every package of the module with its job, and names no package that is
// gone.
func TestArchitectureListsEveryPackage(t *testing.T) {
	base := root(t)
	data, err := os.ReadFile(filepath.Join(base, "docs", "architecture.md"))
	if err != nil {
		t.Fatal(err)
	}
	text := string(data)
	i := strings.Index(text, "## Layout")
	if i < 0 {
		t.Fatal("docs/architecture.md has no Layout section")
	}
	block := text[i:]
	start := strings.Index(block, "```\n")
	end := strings.Index(block[start+4:], "```")
	if start < 0 || end < 0 {
		t.Fatal("the Layout section has no code block")
	}
	listed := map[string]bool{}
	for _, line := range strings.Split(block[start+4:start+4+end], "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		if strings.HasSuffix(f[0], "/") {
			listed[strings.TrimSuffix(f[0], "/")] = true
		}
		if f[0] == "*.go" {
			listed["."] = true
		}
	}
	packages := map[string]bool{}
	for _, dir := range goList(t, base, "-f", "{{.Dir}}", "./...") {
		rel, err := filepath.Rel(base, dir)
		if err != nil {
			t.Fatal(err)
		}
		if rel == "gen" || strings.HasPrefix(rel, "gen/") {
			continue
		}
		packages[rel] = true
		if !listed[rel] {
			t.Errorf("package %s is not in docs/architecture.md's Layout", rel)
		}
	}
	for p := range listed {
		if !packages[p] && !exists(filepath.Join(base, p)) {
			t.Errorf("docs/architecture.md's Layout names %s, which does not exist", p)
		}
	}
}
