package sandbox

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/kibotos/kibotos/internal/node/template"
	"github.com/kibotos/kibotos/internal/nodewire"
)

// The guest the tests build (the one scripts/build.sh builds) declares the
// protocol version this node speaks, in its bytes.
func TestGuestDeclaresProtocolVersion(t *testing.T) {
	if testGuest == "" {
		t.Skip("kibotos-guest is built only for the root tests: " + skipReason)
	}
	b, err := os.ReadFile(testGuest)
	if err != nil {
		t.Fatal(err)
	}
	v, ok := nodewire.GuestProtocolOf(b)
	if !ok || v != nodewire.GuestProtocolVersion {
		t.Fatalf("GuestProtocolOf(kibotos-guest) = %d, %v; want %d", v, ok, nodewire.GuestProtocolVersion)
	}
}

// tarOf archives the tree at dir (numeric owners, modes, symlinks) and
// adds extra entries, the way an operator's published rootfs would be.
func tarOf(t *testing.T, dir string, extra func(*tar.Writer)) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		link := ""
		if fi.Mode()&os.ModeSymlink != 0 {
			link, _ = os.Readlink(p)
		}
		h, err := tar.FileInfoHeader(fi, link)
		if err != nil {
			return err
		}
		h.Name = rel
		if fi.IsDir() {
			h.Name += "/"
		}
		st := fi.Sys().(*syscall.Stat_t)
		h.Uid, h.Gid, h.Uname, h.Gname = int(st.Uid), int(st.Gid), "", ""
		if rel == "etc/passwd" {
			b, _ := os.ReadFile(p)
			b = append(b, "user:x:1000:1000:user:/home/user:/bin/sh\n"...)
			h.Size = int64(len(b))
			if err := tw.WriteHeader(h); err != nil {
				return err
			}
			_, err = tw.Write(b)
			return err
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if fi.Mode().IsRegular() {
			f, err := os.Open(p)
			if err != nil {
				return err
			}
			defer f.Close()
			_, err = io.Copy(tw, f)
			return err
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	extra(tw)
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// A published template (a tar extracted by template.Install) runs like the
// default one: files owned by root and by uid 1000 in the archive are
// theirs inside the workspace, through the idmapped lower layer. The
// execution boots the guest of its Spec.
func TestStartFromExtractedTemplate(t *testing.T) {
	r, _ := newRuntime(t)
	archive := tarOf(t, testTemplate, func(tw *tar.Writer) {
		for _, h := range []*tar.Header{
			{Name: "home/user/", Typeflag: tar.TypeDir, Mode: 0o700, Uid: 1000, Gid: 1000},
			{Name: "home/user/note", Typeflag: tar.TypeReg, Mode: 0o600, Uid: 1000, Gid: 1000, Size: 5},
			{Name: "etc/secret", Typeflag: tar.TypeReg, Mode: 0o600, Size: 5},
			{Name: "usr/bin/suid", Typeflag: tar.TypeReg, Mode: 0o4755, Size: 5},
		} {
			if err := tw.WriteHeader(h); err != nil {
				t.Fatal(err)
			}
			if h.Size > 0 {
				tw.Write([]byte("data\n"))
			}
		}
	})
	dir := filepath.Join(t.TempDir(), "templates")
	path := filepath.Join(t.TempDir(), "debian.tar")
	if err := os.WriteFile(path, archive, 0o600); err != nil {
		t.Fatal(err)
	}
	rootfs, err := template.Install(dir, "debianish", "1", "sha256:"+strings.Repeat("0", 64), path, template.FormatTar,
		template.Limits{MaxBytes: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	const ws = "ws-published"
	s := testSpec(ws)
	s.TemplateDir = rootfs
	// Booted with a guest of its own (as a Platform's would be).
	guest, err := SealGuest(testGuest)
	if err != nil {
		t.Fatal(err)
	}
	defer guest.Close()
	s.Guest = guest
	start(t, r, s)
	defer r.Delete(t.Context(), ws)
	if st, _ := r.Status(ws); st.TemplateDir != rootfs {
		t.Errorf("status template dir %q, want %q", st.TemplateDir, rootfs)
	}
	if got := strings.TrimSpace(sh(t, r, ws, "stat -c '%u:%g %a' /home/user /home/user/note /etc/secret /usr/bin/suid /bin/busybox")); got !=
		"1000:1000 700\n1000:1000 600\n0:0 600\n0:0 4755\n0:0 755" {
		t.Errorf("owners and modes inside:\n%s", got)
	}
	// uid 1000 reads and writes its home, and cannot read root's file.
	out := sh(t, r, ws, "su -s /bin/sh user -c 'id -u; cat /home/user/note; echo new > /home/user/new; cat /etc/secret 2>/dev/null || echo denied'; stat -c %u /home/user/new")
	if out != "1000\ndata\ndenied\n1000\n" {
		t.Errorf("as uid 1000: %q", out)
	}
	// The rootfs on the host is unchanged (the writes went to the layer).
	if _, err := os.Stat(filepath.Join(rootfs, "home/user/new")); !os.IsNotExist(err) {
		t.Errorf("the template was written: %v", err)
	}
}

// Two nodes on one host (two state directories) never share a cgroup: the
// executions' cgroups are below CgroupParent/<a hash of the Root>. Their
// network namespaces are unnamed (each execution's own, held by its PID 1)
// and their firewall tables are named after the state directory too
// (netattach.NewBackstop).
func TestNodeScopedCgroups(t *testing.T) {
	a, b := rootTag("/var/lib/kibotos/node"), rootTag("/var/lib/kibotos/node2")
	if a == b || len(a) != 12 {
		t.Fatalf("root tags %q and %q", a, b)
	}
	if rootTag("/var/lib/kibotos/node/") != a {
		t.Fatal("the tag depends on the spelling of the path")
	}
}

// Two nodes on one host draw ID ranges from the same host IDs: a range one
// claimed is never another's, a stale claim (no execution recorded by the
// Root that claimed it) is taken over, and a freed range is free again.
func TestIDRangesAreClaimedHostWide(t *testing.T) {
	claims := t.TempDir()
	mk := func(name string) *Runtime {
		root := filepath.Join(t.TempDir(), name)
		if err := os.MkdirAll(filepath.Join(root, "exec"), 0o700); err != nil {
			t.Fatal(err)
		}
		return &Runtime{cfg: Config{IDBase: DefaultIDBase, IDRanges: 3, IDClaimDir: claims}, root: root,
			log: slog.New(slog.DiscardHandler), idUsed: map[uint32]string{}}
	}
	a, b := mk("a"), mk("b")
	a1, err := a.allocIDs("ws-a1")
	if err != nil {
		t.Fatal(err)
	}
	// a records its execution, as Start does.
	if err := os.WriteFile(a.statePath("ws-a1"), []byte(`{"workspace_id":"ws-a1","id_base":`+strconv.Itoa(int(a1))+`}`), 0o600); err != nil {
		t.Fatal(err)
	}
	b1, err := b.allocIDs("ws-b1")
	if err != nil || b1 == a1 {
		t.Fatalf("b got %d (%v), a holds %d", b1, err, a1)
	}
	// b's claim is stale: b never recorded it and its process is gone
	// (here: the claim names a process that is not this one). a takes it
	// over.
	b.idUsed = map[uint32]string{}
	forgeDeadClaim(t, b, b1, "ws-b1")
	a2, err := a.allocIDs("ws-a2")
	if err != nil || a2 != b1 {
		t.Fatalf("a got %d (%v), want the stale %d", a2, err, b1)
	}
	// a's claim of a2 is live before a records it (its process runs): b
	// gets the third range, then none.
	if b3, err := b.allocIDs("ws-b3"); err != nil || b3 == a1 || b3 == a2 {
		t.Fatalf("b got %d (%v)", b3, err)
	}
	if _, err := b.allocIDs("ws-b4"); err == nil {
		t.Fatal("a fourth range out of three")
	}
	a.freeIDs("ws-a1", a1)
	if b5, err := b.allocIDs("ws-b5"); err != nil || b5 != a1 {
		t.Fatalf("b got %d (%v), want the freed %d", b5, err, a1)
	}
}

// forgeDeadClaim rewrites r's claim of base as one of a process that no
// longer runs.
func forgeDeadClaim(t *testing.T, r *Runtime, base uint32, ws string) {
	t.Helper()
	b, _ := json.Marshal(idClaim{Root: r.root, WorkspaceID: ws, PID: 1 << 30, PIDStart: 1})
	if err := os.WriteFile(r.claimPath(base), b, 0o600); err != nil {
		t.Fatal(err)
	}
}
