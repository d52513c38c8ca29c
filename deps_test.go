package kibotos_test

import (
	"os/exec"
	"strings"
	"testing"
)

// TestDependencies keeps the SDK small: package kibotos must not pull in the
// server, its stores, their database drivers or gVisor.
func TestDependencies(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go list")
	}
	out, err := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}}", "github.com/kibotos/kibotos").Output()
	if err != nil {
		var stderr string
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = string(ee.Stderr)
		}
		t.Fatalf("go list -deps: %v\n%s", err, stderr)
	}
	forbidden := []string{
		"github.com/kibotos/kibotos/internal/store",
		"github.com/kibotos/kibotos/internal/ctrl",
		"modernc.org/sqlite",
		"github.com/jackc/pgx",
		"gvisor.dev",
	}
	deps := strings.Fields(string(out))
	if len(deps) == 0 {
		t.Fatal("go list -deps listed nothing")
	}
	for _, dep := range deps {
		for _, f := range forbidden {
			if dep == f || strings.HasPrefix(dep, f+"/") {
				t.Errorf("package kibotos depends on %s (forbidden: %s)", dep, f)
			}
		}
	}
}
