package e2e

import (
	"crypto/rand"
	"crypto/sha256"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
)

// cpBigSize is the file TestKiboCp copies each way.
const cpBigSize = 1 << 30

// TestKiboCp: kibo workspace cp with the real binaries (ctrl --dev, its
// node, the guest): a 1 GiB file into a Workspace and back, equal by
// SHA-256, each direction timed, with kibo's peak RSS far below the
// file's size (it streams); then a directory tree there and back.
func TestKiboCp(t *testing.T) {
	if testing.Short() {
		t.Skip("copies 1 GiB each way")
	}
	e := newDPEnv(t, "cp-first")
	ctx := t.Context()
	info, err := ctrlv1connect.NewServerInfoServiceClient(operatorClient(t, e.dataDir), e.p.url).GetServerInfo(ctx, connect.NewRequest(&ctrlv1.GetServerInfoRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(info.Msg.GetCapabilities(), "workspace.filesystem") {
		t.Skipf("the server does not advertise workspace.filesystem: %v", info.Msg.GetCapabilities())
	}
	// A Workspace whose writable layer holds the file (3 GiB).
	cr, err := e.ws.CreateWorkspace(ctx, connect.NewRequest(&ctrlv1.CreateWorkspaceRequest{
		Metadata: md("cp-big"), Resources: &ctrlv1.Resources{MemoryMib: 128, CpuMillis: 500}, WritableLayerCapacityBytes: 3 << 30,
	}))
	if err != nil {
		t.Fatal(err)
	}
	e.id = cr.Msg.GetWorkspace().GetWorkspaceId()
	e.waitReady()

	dir := t.TempDir()
	big := filepath.Join(dir, "big.bin")
	want := writeRandom(t, big, cpBigSize)

	// cp runs kibo workspace cp and returns how long it took and its peak
	// RSS (the kernel's ru_maxrss of the kibo process).
	cp := func(src, dst string) (time.Duration, int64) {
		t.Helper()
		cmd := e.kibo("workspace", "cp", src, dst)
		stdout, stderr, code, took := kiboRun(t, cmd, 10*time.Minute)
		if code != 0 || stdout != "" || stderr != "" {
			t.Fatalf("kibo workspace cp %s %s: exit %d, stdout %q, stderr %q", src, dst, code, stdout, stderr)
		}
		ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage)
		if !ok {
			t.Fatal("no rusage")
		}
		return took, ru.Maxrss << 10 // KiB on Linux
	}
	mibs := func(d time.Duration) float64 { return float64(cpBigSize) / (1 << 20) / d.Seconds() }

	up, upRSS := cp(big, e.id+":/big.bin")
	t.Logf("1 GiB into the Workspace: %v, %.0f MiB/s, kibo peak RSS %.1f MiB", up.Round(time.Millisecond), mibs(up), float64(upRSS)/(1<<20))
	back := filepath.Join(dir, "back.bin")
	down, downRSS := cp(e.id+":/big.bin", back)
	t.Logf("1 GiB out of the Workspace: %v, %.0f MiB/s, kibo peak RSS %.1f MiB", down.Round(time.Millisecond), mibs(down), float64(downRSS)/(1<<20))
	if got := sha256File(t, back); got != want {
		t.Fatalf("SHA-256 of the copy back %x, want %x", got, want)
	}
	for _, rss := range []int64{upRSS, downRSS} {
		if rss > 200<<20 {
			t.Errorf("kibo's peak RSS %d MiB, want under 200 MiB for a 1 GiB copy", rss>>20)
		}
	}
	if err := os.Remove(back); err != nil {
		t.Fatal(err)
	}

	// A tree: modes kept, cp -r placement into an existing directory, a
	// link in the tree skipped on the way in.
	src := filepath.Join(dir, "proj")
	files := map[string]struct {
		content string
		mode    fs.FileMode
	}{
		"a.txt": {"a\n", 0o644}, "bin/run.sh": {"#!/bin/sh\necho run\n", 0o755},
		"deep/er/and/deeper/secret": {strings.Repeat("s", 1<<20+7), 0o600}, "empty": {"", 0o640},
	}
	for name, f := range files {
		p := filepath.Join(src, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(f.content), f.mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, f.mode); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(filepath.Join(src, "nothing"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/etc/shadow", filepath.Join(src, "link")); err != nil {
		t.Fatal(err)
	}
	cmd := e.kibo("workspace", "cp", src, e.id+":/work/proj")
	_, stderr, code, _ := kiboRun(t, cmd, 2*time.Minute)
	if code != 0 || !strings.Contains(stderr, "skipped the symbolic link") {
		t.Fatalf("cp of the tree in: exit %d, stderr %q", code, stderr)
	}
	out := filepath.Join(dir, "out")
	if err := os.Mkdir(out, 0o755); err != nil {
		t.Fatal(err)
	}
	cp(e.id+":/work/proj", out) // into out: out/proj
	wantTree := treeOf(t, src)
	delete(wantTree, "link")
	if got := treeOf(t, filepath.Join(out, "proj")); !maps.Equal(got, wantTree) {
		t.Errorf("the tree back:\n%v\nwant\n%v", got, wantTree)
	}
}

// writeRandom writes n random bytes to p and returns their SHA-256.
func writeRandom(t *testing.T, p string, n int64) [32]byte {
	t.Helper()
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.CopyN(io.MultiWriter(f, h), rand.Reader, n); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	return [32]byte(h.Sum(nil))
}

func sha256File(t *testing.T, p string) [32]byte {
	t.Helper()
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		t.Fatal(err)
	}
	return [32]byte(h.Sum(nil))
}

// treeOf lists the files under dir: relative path → mode and content.
func treeOf(t *testing.T, dir string) map[string]string {
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
			sum := sha256.Sum256(b)
			out[rel] = fmt.Sprintf("%v %d bytes, sha256 %x", fi.Mode().Perm(), len(b), sum[:8])
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}
