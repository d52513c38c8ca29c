package apierr

import (
	"os/exec"
	"strings"
	"testing"
)

// TestDomainWithoutTransport: apierr is the one error mapping; the domain
// packages return faults, recorded failures included, and do not depend on
// Connect (nor on the generated handlers, which do).
func TestDomainWithoutTransport(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go list")
	}
	const module = "github.com/kibotos/kibotos"
	domain := []string{
		module + "/internal/command",
		module + "/internal/workspace",
		module + "/internal/catalog",
		module + "/internal/enrollment",
		module + "/internal/egress",
		module + "/internal/labels",
		module + "/internal/fault",
		module + "/internal/ids",
	}
	forbidden := "connectrpc.com/connect"
	// The handlers do depend on Connect: the check must see it there.
	control := module + "/internal/api"
	// One line per package: its path, then every package it depends on.
	args := append([]string{"list", "-f", "{{.ImportPath}} {{join .Deps \" \"}}", control}, domain...)
	out, err := exec.Command("go", args...).Output()
	if err != nil {
		var stderr string
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = string(ee.Stderr)
		}
		t.Fatalf("go list: %v\n%s", err, stderr)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) != 1+len(domain) {
		t.Fatalf("go list listed %d packages, want %d:\n%s", len(lines), 1+len(domain), out)
	}
	for _, line := range lines {
		f := strings.Fields(line)
		uses := false
		for _, dep := range f[1:] {
			if dep == forbidden || strings.HasPrefix(dep, forbidden+"/") {
				uses = true
				if f[0] != control {
					t.Errorf("%s depends on %s: only internal/apierr and the handlers speak Connect", f[0], dep)
				}
			}
		}
		if f[0] == control && !uses {
			t.Errorf("%s does not depend on %s: the check does not see the dependency", control, forbidden)
		}
	}
}
