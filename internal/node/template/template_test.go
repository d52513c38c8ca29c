package template

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestList(t *testing.T) {
	dir := t.TempDir()
	mk := func(name, version string, age time.Duration) {
		rootfs := Path(dir, name, version)
		if err := os.MkdirAll(rootfs, 0o755); err != nil {
			t.Fatal(err)
		}
		when := time.Now().Add(-age)
		if err := os.Chtimes(filepath.Join(dir, name, version), when, when); err != nil {
			t.Fatal(err)
		}
	}
	mk("default", "v1-old", time.Hour)
	mk("default", "v1-new", time.Minute)
	mk("debian", "12.0", time.Hour)
	if err := os.MkdirAll(filepath.Join(dir, "debian", ".build-x", "rootfs"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(dir, "empty", "1"), 0o755); err != nil { // no rootfs
		t.Fatal(err)
	}
	got, err := List(dir)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"default": "v1-new", "debian": "12.0"}
	if len(got) != len(want) {
		t.Fatalf("List = %+v, want %v", got, want)
	}
	for _, i := range got {
		if want[i.Name] != i.Version || i.Rootfs != Path(dir, i.Name, i.Version) {
			t.Errorf("List: %+v, want version %q", i, want[i.Name])
		}
	}
	if got, err := List(filepath.Join(dir, "missing")); err != nil || got != nil {
		t.Fatalf("List(missing) = %v, %v", got, err)
	}
}

func TestFindBusybox(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "busybox")
	if _, err := FindBusybox(missing); !errors.Is(err, ErrBusyboxMissing) || !strings.Contains(err.Error(), "apt-get install busybox-static") || !strings.Contains(err.Error(), missing) {
		t.Errorf("FindBusybox(%s) = %v, want ErrBusyboxMissing naming busybox-static and the path", missing, err)
	}
	script := filepath.Join(t.TempDir(), "busybox")
	if err := os.WriteFile(script, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := FindBusybox(script); !errors.Is(err, ErrBusyboxMissing) {
		t.Errorf("FindBusybox(a script) = %v, want ErrBusyboxMissing", err)
	}
	def, err := FindBusybox("")
	if err != nil {
		t.Skipf("no busybox-static installed: %v", err)
	}
	if got, err := FindBusybox(def); got != def || err != nil {
		t.Errorf("FindBusybox(%s) = %q, %v, want it back", def, got, err)
	}
}
