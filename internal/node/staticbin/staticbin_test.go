package staticbin

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// buildProgram builds a one-file Go program (src) with cgo on or off.
func buildProgram(t *testing.T, src string, cgo bool) string {
	t.Helper()
	if cgo {
		if _, err := exec.LookPath("gcc"); err != nil {
			t.Skip("cgo needs gcc: apt-get install gcc")
		}
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "prog")
	cmd := exec.Command("go", "build", "-o", out, "main.go")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if cgo {
		cmd.Env = append(os.Environ(), "CGO_ENABLED=1")
	}
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, b)
	}
	return out
}

func TestCheck(t *testing.T) {
	const src = "package main\n\nimport \"C\"\n\nfunc main() {}\n"
	dynamic := buildProgram(t, src, true)
	var de *DynamicError
	if err := Check(dynamic); !errors.As(err, &de) {
		t.Fatalf("Check(cgo build) = %v, want a *DynamicError", err)
	}
	if !strings.HasPrefix(de.Needs(), "/lib") || !strings.Contains(de.Error(), dynamic+" is dynamically linked (needs /lib") {
		t.Errorf("Check(cgo build) = %q (needs %q), want it to name the loader", de, de.Needs())
	}

	static := buildProgram(t, "package main\n\nfunc main() {}\n", false)
	if err := Check(static); err != nil {
		t.Errorf("Check(CGO_ENABLED=0 build) = %v, want nil", err)
	}

	text := filepath.Join(t.TempDir(), "script")
	if err := os.WriteFile(text, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := Check(text); err == nil || errors.As(err, &de) || !strings.Contains(err.Error(), "not an ELF executable") {
		t.Errorf("Check(script) = %v, want 'not an ELF executable'", err)
	}
	if err := Check(filepath.Join(t.TempDir(), "missing")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Check(missing) = %v, want ErrNotExist", err)
	}
}
