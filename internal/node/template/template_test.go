package template

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

func requireBusybox(t *testing.T) {
	t.Helper()
	if _, err := findBusybox(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%v (CI=true)", err)
		}
		t.Skip(err)
	}
}

func fakeGuest(t *testing.T, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "kibotos-guest")
	if err := os.WriteFile(p, []byte(content), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestEnsureDefault(t *testing.T) {
	requireBusybox(t)
	dir := t.TempDir()
	guest := fakeGuest(t, "guest v1")
	rootfs, err := EnsureDefault(dir, guest)
	if err != nil {
		t.Fatal(err)
	}
	version, err := Version(rootfs)
	if err != nil {
		t.Fatal(err)
	}
	if want := Path(dir, DefaultName, version); rootfs != want {
		t.Errorf("rootfs %s, want %s", rootfs, want)
	}
	fi, err := os.Stat(filepath.Join(rootfs, "bin/busybox"))
	if err != nil || fi.Mode().Perm() != 0o755 {
		t.Fatalf("busybox: %v %v", fi, err)
	}
	for _, applet := range []string{"bin/sh", "bin/ls", "bin/cat", "usr/bin/env", "sbin/poweroff"} {
		target, err := os.Readlink(filepath.Join(rootfs, applet))
		if err != nil || target != "/bin/busybox" {
			t.Errorf("%s → %q %v", applet, target, err)
		}
	}
	if b, _ := os.ReadFile(filepath.Join(rootfs, "etc/passwd")); !bytes.HasPrefix(b, []byte("root:x:0:0:")) {
		t.Errorf("passwd: %q", b)
	}
	for _, f := range []string{"etc/group", "etc/hostname", "etc/hosts", "etc/profile", "etc/os-release"} {
		if _, err := os.Stat(filepath.Join(rootfs, f)); err != nil {
			t.Error(err)
		}
	}
	if b, _ := os.ReadFile(filepath.Join(rootfs, "usr/sbin/kibotos-guest")); string(b) != "guest v1" {
		t.Errorf("guest copy: %q", b)
	}
	for d, mode := range map[string]os.FileMode{"tmp": os.ModeSticky | 0o777, "root": 0o700, "proc": 0o555, "sys": 0o555, "dev": 0o755, "run": 0o755} {
		fi, err := os.Stat(filepath.Join(rootfs, d))
		if err != nil || !fi.IsDir() {
			t.Errorf("%s: %v", d, err)
			continue
		}
		got := fi.Mode().Perm() | fi.Mode()&os.ModeSticky
		if want := mode; got != want {
			t.Errorf("%s mode %v, want %v", d, got, mode)
		}
	}

	// Idempotent, and no build leftovers.
	again, err := EnsureDefault(dir, guest)
	if err != nil || again != rootfs {
		t.Fatalf("second call: %s %v", again, err)
	}
	ents, _ := os.ReadDir(filepath.Join(dir, DefaultName))
	if len(ents) != 1 {
		t.Errorf("entries in %s: %v", filepath.Join(dir, DefaultName), ents)
	}

	// Another guest is another version; the old one stays.
	other, err := EnsureDefault(dir, fakeGuest(t, "guest v2"))
	if err != nil || other == rootfs {
		t.Fatalf("new guest: %s %v", other, err)
	}
	if _, err := os.Stat(rootfs); err != nil {
		t.Errorf("old version removed: %v", err)
	}
}

func TestEnsureDefaultConcurrent(t *testing.T) {
	requireBusybox(t)
	dir := t.TempDir()
	guest := fakeGuest(t, "guest")
	var wg sync.WaitGroup
	paths := make([]string, 4)
	errs := make([]error, 4)
	for i := range paths {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			paths[i], errs[i] = EnsureDefault(dir, guest)
		}(i)
	}
	wg.Wait()
	for i := range paths {
		if errs[i] != nil || paths[i] != paths[0] {
			t.Errorf("call %d: %s %v", i, paths[i], errs[i])
		}
	}
	ents, _ := os.ReadDir(filepath.Join(dir, DefaultName))
	if len(ents) != 1 {
		t.Errorf("entries after concurrent builds: %v", ents)
	}
}

func TestEnsureDefaultNeedsStaticBusybox(t *testing.T) {
	saved := busyboxCandidates
	defer func() { busyboxCandidates = saved }()
	for _, candidates := range [][]string{{"/nonexistent/busybox"}, {"/proc/self/exe"}, {"/bin/sh"}} {
		busyboxCandidates = candidates
		_, err := EnsureDefault(t.TempDir(), "")
		if candidates[0] == "/proc/self/exe" || candidates[0] == "/bin/sh" {
			// Dynamic binaries do not qualify; a static one would.
			if f, _ := findBusybox(); f != "" {
				continue
			}
		}
		if !errors.Is(err, ErrBusyboxMissing) || !strings.Contains(err.Error(), "apt-get install busybox-static") {
			t.Errorf("%v: %v", candidates, err)
		}
	}
}
