package cli

import (
	"bytes"
	"crypto/rand"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kibotos/kibotos/gen/kibotos/guest/v1/guestv1connect"
	"github.com/kibotos/kibotos/internal/capability"
	"github.com/kibotos/kibotos/internal/ctrltest"
	"github.com/kibotos/kibotos/internal/guest"
	"github.com/kibotos/kibotos/internal/node/agent/agenttest"
)

// cpEnv is a ctrl whose node's guests serve the real guest FileService on
// a temporary directory (the Workspace's root), and an AVAILABLE
// Workspace: the connection flags, the Workspace's ID and its root.
func cpEnv(t *testing.T) (c []string, id, root string) {
	t.Helper()
	root = t.TempDir()
	rt := agenttest.New()
	p, h := guestv1connect.NewFileServiceHandler(guest.NewFileService(root))
	rt.GuestServices = map[string]http.Handler{p: h}
	t.Cleanup(rt.Close)
	e := ctrltest.New(t, ctrltest.Options{Runtime: rt})
	c = conn(e)
	waitWorkspaceServed(t, c)
	id = strings.TrimSpace(kibo(t, args(c, "workspace", "create", "--memory-mib", "256", "--cpu-millis", "500", "-q", "--wait")...).want(t, ExitOK).stdout)
	return c, id, root
}

// tree lists the files under dir: relative path → content, "dir" for a
// directory, "-> target" for a link, with the permission bits.
func tree(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		fi, err := d.Info()
		if err != nil {
			return err
		}
		switch {
		case d.IsDir():
			out[rel] = "dir " + fi.Mode().Perm().String()
		case d.Type()&fs.ModeSymlink != 0:
			target, _ := os.Readlink(p)
			out[rel] = "-> " + target
		default:
			b, _ := os.ReadFile(p)
			out[rel] = fi.Mode().Perm().String() + " " + string(b)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func mkfile(t *testing.T, p, content string, mode fs.FileMode) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil {
		t.Fatal(err)
	}
}

// TestWorkspaceCp: files and trees into and out of a Workspace, modes
// kept, cp -r's placement in an existing directory, standard input and
// output, links, and kibo's usage errors.
func TestWorkspaceCp(t *testing.T) {
	t.Parallel()
	c, id, root := cpEnv(t)
	cp := func(stdin string, rest ...string) result {
		return kiboWith(t, testEnv(t), stdin, args(c, append([]string{"workspace", "cp"}, rest...)...)...)
	}
	local := t.TempDir()

	t.Run("File", func(t *testing.T) {
		content := make([]byte, 700<<10+3)
		rand.Read(content)
		mkfile(t, filepath.Join(local, "f.bin"), string(content), 0o751)
		if r := cp("", filepath.Join(local, "f.bin"), id+":/up/f.bin").want(t, ExitOK); r.stdout != "" || r.stderr != "" {
			t.Errorf("stdout %q, stderr %q; want nothing off a terminal", r.stdout, r.stderr)
		}
		st, err := os.Stat(filepath.Join(root, "up/f.bin"))
		if b, _ := os.ReadFile(filepath.Join(root, "up/f.bin")); err != nil || !bytes.Equal(b, content) || st.Mode().Perm() != 0o751 {
			t.Fatalf("in the Workspace: %d bytes, %v, %v", len(b), st.Mode(), err)
		}
		// Into an existing local directory: under its own name.
		out := t.TempDir()
		cp("", id+":up/f.bin", out).want(t, ExitOK)
		st, err = os.Stat(filepath.Join(out, "f.bin"))
		if b, _ := os.ReadFile(filepath.Join(out, "f.bin")); err != nil || !bytes.Equal(b, content) || st.Mode().Perm() != 0o751 {
			t.Fatalf("back: %d bytes, %v, %v", len(b), st.Mode(), err)
		}
		// To a new name, over an existing file.
		cp("", id+":/up/f.bin", filepath.Join(out, "g")).want(t, ExitOK)
		cp("", id+":/up/f.bin", filepath.Join(out, "g")).want(t, ExitOK)
		if b, _ := os.ReadFile(filepath.Join(out, "g")); !bytes.Equal(b, content) {
			t.Error("g differs")
		}
		if ents, _ := os.ReadDir(out); len(ents) != 2 {
			t.Errorf("%d files in the local directory, want 2 (no temporary file left)", len(ents))
		}
	})
	t.Run("SetuidDroppedOnTheWayOut", func(t *testing.T) {
		mkfile(t, filepath.Join(local, "suid"), "x", 0o755|fs.ModeSetuid)
		cp("", filepath.Join(local, "suid"), id+":/suid").want(t, ExitOK)
		if st, _ := os.Stat(filepath.Join(root, "suid")); st.Mode()&fs.ModeSetuid == 0 {
			t.Errorf("in the Workspace: mode %v, want setuid kept", st.Mode())
		}
		out := filepath.Join(t.TempDir(), "suid")
		cp("", id+":/suid", out).want(t, ExitOK)
		if st, _ := os.Stat(out); st.Mode() != 0o755 {
			t.Errorf("locally: mode %v, want 0755 without setuid", st.Mode())
		}
	})
	t.Run("Tree", func(t *testing.T) {
		src := filepath.Join(local, "proj")
		mkfile(t, filepath.Join(src, "a.txt"), "a", 0o644)
		mkfile(t, filepath.Join(src, "sub/b.sh"), "#!/bin/sh\n", 0o755)
		mkfile(t, filepath.Join(src, "sub/deep/c"), strings.Repeat("c", 300<<10), 0o600)
		if err := os.MkdirAll(filepath.Join(src, "empty"), 0o750); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink("/etc/passwd", filepath.Join(src, "link")); err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(filepath.Join(root, "work"), 0o755); err != nil {
			t.Fatal(err)
		}
		// Into an existing directory: inside it, the link skipped.
		r := cp("", src, id+":/work").want(t, ExitOK)
		if !strings.Contains(r.stderr, "warning: skipped the symbolic link "+filepath.Join(src, "link")) {
			t.Errorf("stderr %q, want a warning for the link", r.stderr)
		}
		want := tree(t, src)
		delete(want, "link")
		if got := tree(t, filepath.Join(root, "work/proj")); !equalMaps(got, want) {
			t.Errorf("in the Workspace:\n%v\nwant\n%v", got, want)
		}
		// A link in the Workspace comes back as a link, never followed.
		if err := os.Symlink("/etc", filepath.Join(root, "work/proj/etc")); err != nil {
			t.Fatal(err)
		}
		out := filepath.Join(t.TempDir(), "copy")
		cp("", id+":/work/proj", out).want(t, ExitOK)
		want["etc"] = "-> /etc"
		if got := tree(t, out); !equalMaps(got, want) {
			t.Errorf("back:\n%v\nwant\n%v", got, want)
		}
		// Again into the copy, now existing: inside it.
		cp("", id+":/work/proj", out).want(t, ExitOK)
		if _, err := os.Stat(filepath.Join(out, "proj/sub/deep/c")); err != nil {
			t.Errorf("a copy into an existing directory: %v", err)
		}
	})
	t.Run("Stdio", func(t *testing.T) {
		cp("from stdin\n", "-", id+":/in/s.txt").want(t, ExitOK)
		if b, _ := os.ReadFile(filepath.Join(root, "in/s.txt")); string(b) != "from stdin\n" {
			t.Errorf("written %q", b)
		}
		if r := cp("", id+":/in/s.txt", "-").want(t, ExitOK); r.stdout != "from stdin\n" {
			t.Errorf("stdout %q", r.stdout)
		}
		cp("", id+":/in", "-").want(t, ExitUsage)
		cp("x", "-", id+":/in").want(t, ExitUsage)
	})
	t.Run("Progress", func(t *testing.T) {
		e := testEnv(t)
		e.isTerminal = func(io.Writer) bool { return true }
		var clock time.Time
		e.now = func() time.Time { clock = clock.Add(time.Second); return clock }
		r := kiboWith(t, e, strings.Repeat("p", 1<<20), args(c, "workspace", "cp", "-", id+":/p")...).want(t, ExitOK)
		if !strings.Contains(r.stderr, "\r") || !strings.Contains(r.stderr, "1.0 MiB copied") || !strings.Contains(r.stderr, "/s") || !strings.HasSuffix(r.stderr, "\n") {
			t.Errorf("stderr on a terminal = %q", r.stderr)
		}
	})
	t.Run("Errors", func(t *testing.T) {
		cp("", filepath.Join(local, "a"), filepath.Join(local, "b")).want(t, ExitUsage)
		cp("", id+":/a", id+":/b").want(t, ExitUsage)
		cp("", "-", "-").want(t, ExitUsage)
		cp("", id+":/nothing", t.TempDir()).want(t, 5) // not_found
		cp("", filepath.Join(local, "nothing"), id+":/x").want(t, ExitLocal)
		cp("", id+":/x", "").want(t, ExitUsage)
	})
}

func equalMaps(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// TestWorkspaceCpMissingCapability: a server without workspace.filesystem
// (no node) makes cp exit 14 before sending anything but GetServerInfo.
func TestWorkspaceCpMissingCapability(t *testing.T) {
	t.Parallel()
	e := ctrltest.New(t, ctrltest.Options{})
	c := conn(e)
	dir := t.TempDir()
	mkfile(t, filepath.Join(dir, "f"), "x", 0o644)
	r := kibo(t, args(c, "workspace", "cp", filepath.Join(dir, "f"), "ws-0123456789abcdefghij:/f")...).want(t, ExitUnavailable)
	if !strings.Contains(r.stderr, capability.WorkspaceFilesystem) || !strings.Contains(r.stderr, "nothing was sent") {
		t.Errorf("stderr %q", r.stderr)
	}
	kibo(t, args(c, "workspace", "cp", "ws-0123456789abcdefghij:/f", dir)...).want(t, ExitUnavailable)
}
