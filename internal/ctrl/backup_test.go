package ctrl

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kibotos/kibotos/internal/store/sqlite"
)

// TestBackupCommand runs `kibotos-ctrl backup` against a store that is open
// (as under a running ctrl): it writes the copy, refuses to replace it
// without --force, and refuses what it cannot back up.
func TestBackupCommand(t *testing.T) {
	dir := t.TempDir()
	s, err := sqlite.Open(context.Background(), filepath.Join(dir, "ctrl.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	out := filepath.Join(t.TempDir(), "ctrl-backup.db")
	run := func(args ...string) (int, string, string) {
		var o, e bytes.Buffer
		code := Main(append([]string{"backup"}, args...), &o, &e)
		return code, o.String(), e.String()
	}
	for _, tc := range []struct {
		name     string
		args     []string
		code     int
		contains string
	}{
		{"first", []string{"--data-dir", dir, "--out", out}, 0, "bytes in"},
		{"exists", []string{"--data-dir", dir, "--out", out}, 1, "pass --force"},
		{"force", []string{"--data-dir", dir, "--out", out, "--force"}, 0, "bytes in"},
		{"store path", []string{"--store", filepath.Join(dir, "ctrl.db"), "--out", out, "--force"}, 0, "bytes in"},
		{"postgres", []string{"--store", "postgres://u@127.0.0.1/db", "--out", out}, 2, "pg_dump"},
		{"no out", []string{"--data-dir", dir}, 2, "--out is required"},
		{"both", []string{"--data-dir", dir, "--store", "x.db", "--out", out}, 2, "one of"},
		{"itself", []string{"--data-dir", dir, "--out", filepath.Join(dir, "ctrl.db")}, 2, "database itself"},
		{"missing", []string{"--data-dir", t.TempDir(), "--out", out + "2"}, 1, "no such file"},
	} {
		code, stdout, stderr := run(tc.args...)
		if code != tc.code || !strings.Contains(stdout+stderr, tc.contains) {
			t.Errorf("%s: exit %d, stdout %q, stderr %q; want exit %d and %q", tc.name, code, stdout, stderr, tc.code, tc.contains)
		}
	}
	if _, err := os.Stat(out); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(out + "2"); err == nil {
		t.Error("a backup of a missing database was written")
	}
}
