package daemon

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kibotos/kibotos/internal/node/agent"
	"github.com/kibotos/kibotos/internal/node/sandbox"
	"github.com/kibotos/kibotos/internal/node/staticbin"
	"github.com/kibotos/kibotos/internal/node/template"
)

func TestAbsPaths(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir)
	rel, abs, empty := ".data/node", "/var/lib/kibotos", ""
	if err := AbsPaths(&rel, &abs, &empty); err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(dir, ".data/node"); rel != want {
		t.Errorf("AbsPaths(.data/node) = %q, want %q", rel, want)
	}
	if abs != "/var/lib/kibotos" || empty != "" {
		t.Errorf("AbsPaths changed %q or %q", abs, empty)
	}
}

// staticStandIn returns a static executable to stand in for kibotos-guest
// (Preflight checks only that it is static): Debian's busybox.
func staticStandIn(t *testing.T) string {
	t.Helper()
	p, err := template.FindBusybox("")
	if err != nil {
		t.Skipf("needs a static busybox as a stand-in guest: %v", err)
	}
	return p
}

func TestPreflight(t *testing.T) {
	static := staticStandIn(t)
	dir := t.TempDir()
	t.Chdir(dir)
	if err := os.Symlink(static, "kibotos-guest"); err != nil {
		t.Fatal(err)
	}

	// Relative paths come back absolute (the bug: a relative state dir
	// made every template dir relative, which no start accepts).
	cfg, err := Preflight(Config{StateDir: ".data/node", GuestBinary: "kibotos-guest"})
	if os.Geteuid() != 0 {
		if err == nil || !strings.Contains(err.Error(), "needs root") {
			t.Fatalf("Preflight as non-root = %v, want 'needs root'", err)
		}
	} else if err != nil {
		t.Fatalf("Preflight = %v", err)
	}
	if want := filepath.Join(dir, ".data/node"); cfg.StateDir != want {
		t.Errorf("StateDir = %q, want %q", cfg.StateDir, want)
	}
	if want := filepath.Join(dir, "kibotos-guest"); cfg.GuestBinary != want {
		t.Errorf("GuestBinary = %q, want %q", cfg.GuestBinary, want)
	}

	refused := []struct {
		name string
		cfg  Config
		want string
	}{
		{"busybox missing", Config{StateDir: dir, GuestBinary: static, Busybox: filepath.Join(dir, "no-busybox")}, "apt-get install busybox-static"},
		{"state dir with ':'", Config{StateDir: filepath.Join(dir, "a:b"), GuestBinary: static}, "must not contain"},
		{"guest missing", Config{StateDir: dir, GuestBinary: filepath.Join(dir, "missing")}, "no such file"},
		{"no guest", Config{StateDir: dir}, "no guest binary"},
	}
	if exe, err := os.Executable(); err == nil {
		var de *staticbin.DynamicError
		if errors.As(staticbin.Check(exe), &de) { // the test binary, when built with cgo
			refused = append(refused, struct {
				name string
				cfg  Config
				want string
			}{"dynamic guest", Config{StateDir: dir, GuestBinary: exe}, "is dynamically linked (needs " + de.Needs() + "); build it with CGO_ENABLED=0"})
		}
	}
	for _, tt := range refused {
		if _, err := Preflight(tt.cfg); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("Preflight(%s) = %v, want %q", tt.name, err, tt.want)
		}
	}
}

// TestRunRefusesBeforeReady: a node that cannot run workspaces returns
// from Run with the reason, before it reports ready or dials ctrl.
func TestRunRefusesBeforeReady(t *testing.T) {
	static := staticStandIn(t)
	var logs strings.Builder
	err := Run(t.Context(), Config{StateDir: t.TempDir(), GuestBinary: static, Busybox: "/nonexistent/busybox",
		Endpoint: "https://127.0.0.1:1", Log: slog.New(slog.NewTextHandler(&logs, nil))})
	if !errors.Is(err, template.ErrBusyboxMissing) {
		t.Fatalf("Run = %v, want ErrBusyboxMissing", err)
	}
	if strings.Contains(logs.String(), "node ready") {
		t.Fatalf("the node reported ready:\n%s", logs.String())
	}
}

// TestStartFailuresNoRetryFixes: the runtime adapter marks what no retry
// can fix, and leaves unusable templates out of what the node offers.
func TestStartFailuresNoRetryFixes(t *testing.T) {
	if os.Geteuid() != 0 {
		if os.Getenv("CI") == "true" {
			t.Fatal("CI runs as root: this test must not skip")
		}
		t.Skip("the sandbox runtime needs root")
	}
	static := staticStandIn(t)
	root := t.TempDir()
	tmpl := filepath.Join(root, "templates")
	for _, name := range []string{"good", "bad:name"} {
		if err := os.MkdirAll(template.Path(tmpl, name, "v1"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	rt, err := sandbox.New(sandbox.Config{Root: root, GuestBinary: static})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	r := NewRuntime(rt, tmpl)

	list, err := usableTemplates(tmpl)
	if len(list) != 1 || list[0].Name != "good" || err == nil || !strings.Contains(err.Error(), "bad:name") {
		t.Errorf("usableTemplates = %+v, %v; want only good, and an error naming bad:name", list, err)
	}
	for _, id := range []string{"missing", "bad:name"} {
		err := r.Start(context.Background(), agent.Spec{WorkspaceID: "ws-1", Generation: 1, TemplateID: id,
			CapacityBytes: 64 << 20, MemoryMiB: 64, CPUMillis: 100})
		if !errors.Is(err, agent.ErrPermanent) {
			t.Errorf("Start(template %q) = %v, want agent.ErrPermanent", id, err)
		}
	}
}
