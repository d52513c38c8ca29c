package guest

import (
	"os"
	"path/filepath"
	"testing"
)

// TestWriteResolvConf: the file is written whatever was there (a file, a
// symbolic link pointing out, nothing, no etc at all), the link itself being
// replaced and its target untouched; an etc that is a symbolic link is
// refused.
func TestWriteResolvConf(t *testing.T) {
	check := func(root string) {
		t.Helper()
		p := filepath.Join(root, "etc", "resolv.conf")
		fi, err := os.Lstat(p)
		if err != nil {
			t.Fatal(err)
		}
		if !fi.Mode().IsRegular() || fi.Mode().Perm() != 0o644 {
			t.Errorf("resolv.conf: mode %v", fi.Mode())
		}
		if b, _ := os.ReadFile(p); string(b) != ResolvConf {
			t.Errorf("resolv.conf: %q", b)
		}
		ents, _ := os.ReadDir(filepath.Join(root, "etc"))
		for _, e := range ents {
			if e.Name() != "resolv.conf" && e.Name() != "hosts" {
				t.Errorf("left in etc: %s", e.Name())
			}
		}
	}
	// No etc.
	root := t.TempDir()
	if err := writeResolvConf(root); err != nil {
		t.Fatal(err)
	}
	check(root)
	// A file, then again (idempotent).
	if err := os.WriteFile(filepath.Join(root, "etc", "resolv.conf"), []byte("nameserver 8.8.8.8\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := writeResolvConf(root); err != nil {
		t.Fatal(err)
	}
	check(root)
	// A symbolic link to a file outside: replaced, the target kept.
	outside := filepath.Join(t.TempDir(), "target")
	if err := os.WriteFile(outside, []byte("mine\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	root = t.TempDir()
	os.Mkdir(filepath.Join(root, "etc"), 0o755)
	os.WriteFile(filepath.Join(root, "etc", "hosts"), []byte("127.0.0.1 localhost\n"), 0o644)
	if err := os.Symlink(outside, filepath.Join(root, "etc", "resolv.conf")); err != nil {
		t.Fatal(err)
	}
	if err := writeResolvConf(root); err != nil {
		t.Fatal(err)
	}
	check(root)
	if b, _ := os.ReadFile(outside); string(b) != "mine\n" {
		t.Errorf("the link's target was written: %q", b)
	}
	// etc a symbolic link: refused, nothing written through it.
	root = t.TempDir()
	elsewhere := t.TempDir()
	if err := os.Symlink(elsewhere, filepath.Join(root, "etc")); err != nil {
		t.Fatal(err)
	}
	if err := writeResolvConf(root); err == nil {
		t.Error("written through a symbolic link etc")
	}
	if ents, _ := os.ReadDir(elsewhere); len(ents) != 0 {
		t.Errorf("written into the link's target: %v", ents)
	}
}
