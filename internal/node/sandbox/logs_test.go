package sandbox

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"
)

// TestOpenLog: the rotated file and the current one, each when it exists;
// ErrNoLog without either or for a name that is not one file; a symlink is
// never followed.
func TestOpenLog(t *testing.T) {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "logs"), 0o700); err != nil {
		t.Fatal(err)
	}
	r := &Runtime{root: dir}
	read := func(f *os.File) string {
		if f == nil {
			return "<nil>"
		}
		defer f.Close()
		b, _ := io.ReadAll(f)
		return string(b)
	}
	for _, id := range []string{"ws-a", "", ".", "..", "../logs/ws-a", "ws-a\x00"} {
		if _, _, err := r.OpenLog(id); !errors.Is(err, ErrNoLog) {
			t.Errorf("OpenLog(%q) with no log = %v, want ErrNoLog", id, err)
		}
	}
	cur := r.logPath("ws-a")
	if err := os.WriteFile(cur, []byte("current\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	rot, c, err := r.OpenLog("ws-a")
	if err != nil || rot != nil || read(c) != "current\n" {
		t.Errorf("current only: %v, %v", rot, err)
	}
	if err := os.WriteFile(cur+".1", []byte("rotated\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	rot, c, err = r.OpenLog("ws-a")
	if err != nil || read(rot) != "rotated\n" || read(c) != "current\n" {
		t.Errorf("both: %v", err)
	}
	if err := os.Remove(cur); err != nil {
		t.Fatal(err)
	}
	rot, c, err = r.OpenLog("ws-a")
	if err != nil || read(rot) != "rotated\n" || c != nil {
		t.Errorf("rotated only: %v", err)
	}
	secret := filepath.Join(dir, "secret")
	if err := os.WriteFile(secret, []byte("secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(secret, cur); err != nil {
		t.Fatal(err)
	}
	if rot, c, err := r.OpenLog("ws-a"); err == nil {
		t.Errorf("a symlinked log was opened: %q %q", read(rot), read(c))
	}
}
