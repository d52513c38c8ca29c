package sandbox

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// buildGuest builds cmd/kibotos-guest with cgo on or off, the way a plain
// `go build ./cmd/...` and scripts/build.sh do.
func buildGuest(t *testing.T, cgo string) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), "kibotos-guest")
	cmd := exec.Command("go", "build", "-o", out, "github.com/kibotos/kibotos/cmd/kibotos-guest")
	cmd.Env = append(os.Environ(), "CGO_ENABLED="+cgo)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("CGO_ENABLED=%s go build kibotos-guest: %v\n%s", cgo, err, b)
	}
	return out
}

func requireGCC(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("gcc"); err != nil {
		t.Skip("cgo builds need gcc: apt-get install gcc")
	}
}

// TestGuestStaticHoweverBuilt: a plain `go build` with cgo on must give a
// guest the node accepts (static), as CGO_ENABLED=0 does.
func TestGuestStaticHoweverBuilt(t *testing.T) {
	requireGCC(t)
	for _, cgo := range []string{"0", "1"} {
		if err := CheckGuestBinary(buildGuest(t, cgo)); err != nil {
			t.Errorf("CheckGuestBinary(CGO_ENABLED=%s build) = %v, want nil", cgo, err)
		}
	}
}

// TestCheckGuestBinaryRefusesDynamic: a dynamic guest cannot start in a
// template (no loader there); the node says what to do instead.
func TestCheckGuestBinaryRefusesDynamic(t *testing.T) {
	requireGCC(t)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte("package main\n\nimport \"C\"\n\nfunc main() {}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	dynamic := filepath.Join(dir, "kibotos-guest")
	cmd := exec.Command("go", "build", "-o", dynamic, "main.go")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=1")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, b)
	}
	err := CheckGuestBinary(dynamic)
	want := fmt.Sprintf("kibotos-guest at %s is dynamically linked (needs /lib", dynamic)
	if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "build it with CGO_ENABLED=0, e.g. scripts/build.sh") {
		t.Fatalf("CheckGuestBinary(dynamic) = %v, want %q … CGO_ENABLED=0, e.g. scripts/build.sh", err, want)
	}
	if err := CheckGuestBinary(dir); err == nil {
		t.Error("CheckGuestBinary(a directory) = nil")
	}
	if err := CheckGuestBinary(filepath.Join(dir, "missing")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("CheckGuestBinary(missing) = %v, want ErrNotExist", err)
	}
}

func TestCheckTemplateDir(t *testing.T) {
	dir := t.TempDir()
	colon := filepath.Join(dir, "a:b")
	if err := os.Mkdir(colon, 0o755); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		dir string
		ok  bool
	}{
		{dir, true},
		{".data/node/templates/default/v1/rootfs", false},
		{colon, false},
		{file, false},
		{filepath.Join(dir, "missing"), false},
	} {
		err := CheckTemplateDir(tt.dir)
		if (err == nil) != tt.ok || (err != nil && !errors.Is(err, ErrInvalidSpec)) {
			t.Errorf("CheckTemplateDir(%q) = %v, want ok=%v (else ErrInvalidSpec)", tt.dir, err, tt.ok)
		}
	}
}

func TestCheckRoot(t *testing.T) {
	for _, tt := range []struct {
		root string
		ok   bool
	}{
		{"/var/lib/kibotos/node", true},
		{".data/node", false},
		{"/srv/a,b", false},
		{"/srv/a:b", false},
	} {
		if err := CheckRoot(tt.root); (err == nil) != tt.ok {
			t.Errorf("CheckRoot(%q) = %v, want ok=%v", tt.root, err, tt.ok)
		}
	}
}

func TestPermanent(t *testing.T) {
	for _, tt := range []struct {
		err  error
		want bool
	}{
		{fmt.Errorf("%w: template dir %q must be absolute", ErrInvalidSpec, "x"), true},
		{fmt.Errorf("%w: not whole MiB", ErrCapacity), true},
		{fmt.Errorf("%w: mount: device busy", ErrStart), false},
		{ErrGuestNotReady, false},
		{nil, false},
	} {
		if got := Permanent(tt.err); got != tt.want {
			t.Errorf("Permanent(%v) = %v, want %v", tt.err, got, tt.want)
		}
	}
}
