package template

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

type ent struct {
	name, link string
	typ        byte
	mode       int64
	uid, gid   int
	body       string
}

func mkTar(t testing.TB, ents []ent) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range ents {
		h := &tar.Header{Name: e.name, Linkname: e.link, Typeflag: e.typ, Mode: e.mode, Uid: e.uid, Gid: e.gid,
			ModTime: time.Unix(1700000000, 0), Format: tar.FormatPAX}
		if h.Mode == 0 {
			h.Mode = 0o644
		}
		if e.typ == tar.TypeReg {
			h.Size = int64(len(e.body))
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if e.typ == tar.TypeReg {
			if _, err := tw.Write([]byte(e.body)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// sandboxDir is a directory with the extraction root and a sentinel next
// to it that no extraction may touch.
func sandboxDir(t testing.TB) (root, outside string) {
	base := t.TempDir()
	root = filepath.Join(base, "rootfs")
	outside = filepath.Join(base, "outside")
	if err := os.MkdirAll(root, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(outside, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(outside, "passwd"), []byte("sentinel"), 0o644); err != nil {
		t.Fatal(err)
	}
	return root, outside
}

func checkOutside(t testing.TB, outside string) {
	t.Helper()
	ents, err := os.ReadDir(outside)
	if err != nil || len(ents) != 1 {
		t.Fatalf("outside changed: %v %v", ents, err)
	}
	b, err := os.ReadFile(filepath.Join(outside, "passwd"))
	if err != nil || string(b) != "sentinel" {
		t.Fatalf("sentinel changed: %q %v", b, err)
	}
}

var lim = Limits{MaxEntries: 1000, MaxBytes: 1 << 20}

func TestExtractKeepsWhatARootfsNeeds(t *testing.T) {
	root, _ := sandboxDir(t)
	archive := mkTar(t, []ent{
		{name: "./", typ: tar.TypeDir, mode: 0o755},
		{name: "bin/", typ: tar.TypeDir, mode: 0o755},
		{name: "bin/sh", typ: tar.TypeReg, mode: 0o755, body: "#!shell"},
		{name: "usr/bin/sudo", typ: tar.TypeReg, mode: 0o4755, body: "setuid"},
		{name: "bin/ash", typ: tar.TypeLink, link: "bin/sh"},
		{name: "bin/dash", typ: tar.TypeSymlink, link: "/bin/sh", mode: 0o777},
		{name: "home/user/", typ: tar.TypeDir, mode: 0o700, uid: 1000, gid: 1000},
		{name: "home/user/.profile", typ: tar.TypeReg, mode: 0o644, uid: 1000, gid: 1000, body: "x"},
		{name: "tmp/", typ: tar.TypeDir, mode: 0o1777},
		{name: "run/fifo", typ: tar.TypeFifo, mode: 0o600},
		{name: "dev/null", typ: tar.TypeChar, mode: 0o666},
		{name: "etc/ro/", typ: tar.TypeDir, mode: 0o555},
		{name: "etc/ro/file", typ: tar.TypeReg, body: "ro"},
		{name: "bin/sh", typ: tar.TypeReg, mode: 0o755, body: "replaced"},
	})
	for _, f := range []Format{FormatTar, FormatTarGzip} {
		dir := filepath.Join(root, map[Format]string{FormatTar: "tar", FormatTarGzip: "gz"}[f])
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		r := bytes.NewReader(archive)
		if f == FormatTarGzip {
			var gz bytes.Buffer
			zw := gzip.NewWriter(&gz)
			zw.Write(archive)
			zw.Close()
			r = bytes.NewReader(gz.Bytes())
		}
		if err := Extract(r, f, dir, lim); err != nil {
			t.Fatal(err)
		}
		// Without root, TempDir's cleanup could not empty a read-only
		// directory.
		t.Cleanup(func() { _ = os.Chmod(filepath.Join(dir, "etc/ro"), 0o755) })
		stat := func(p string) *syscall.Stat_t {
			var st syscall.Stat_t
			if err := syscall.Lstat(filepath.Join(dir, p), &st); err != nil {
				t.Fatalf("%s: %v", p, err)
			}
			return &st
		}
		if b, _ := os.ReadFile(filepath.Join(dir, "bin/sh")); string(b) != "replaced" {
			t.Errorf("bin/sh = %q", b)
		}
		if st := stat("usr/bin/sudo"); st.Mode&0o7777 != 0o4755 {
			t.Errorf("sudo mode %o", st.Mode&0o7777)
		}
		if st := stat("tmp"); st.Mode&0o7777 != 0o1777 {
			t.Errorf("tmp mode %o", st.Mode&0o7777)
		}
		if st := stat("etc/ro"); st.Mode&0o7777 != 0o555 {
			t.Errorf("etc/ro mode %o", st.Mode&0o7777)
		}
		if l, _ := os.Readlink(filepath.Join(dir, "bin/dash")); l != "/bin/sh" {
			t.Errorf("bin/dash -> %q", l)
		}
		if st := stat("run/fifo"); st.Mode&syscall.S_IFMT != syscall.S_IFIFO {
			t.Errorf("fifo mode %o", st.Mode)
		}
		if _, err := os.Lstat(filepath.Join(dir, "dev/null")); !os.IsNotExist(err) {
			t.Errorf("device node made: %v", err)
		}
		if os.Geteuid() == 0 {
			if st := stat("home/user/.profile"); st.Uid != 1000 || st.Gid != 1000 {
				t.Errorf("owner %d:%d", st.Uid, st.Gid)
			}
			if st := stat("home/user"); st.Uid != 1000 || st.Mode&0o777 != 0o700 {
				t.Errorf("home/user %d %o", st.Uid, st.Mode)
			}
		}
		if a, b := stat("bin/ash"), stat("usr/bin/sudo"); a.Nlink != 1 || b == nil {
			// bin/ash links the first bin/sh, which a later entry replaced.
			t.Errorf("bin/ash nlink %d", a.Nlink)
		}
	}
}

func TestExtractRefusesHostileArchives(t *testing.T) {
	long := strings.Repeat("a", 300)
	for _, tc := range []struct {
		name string
		ents []ent
	}{
		{"dot-dot", []ent{{name: "../x", typ: tar.TypeReg, body: "x"}}},
		{"dot-dot inside", []ent{{name: "a/../../x", typ: tar.TypeReg, body: "x"}}},
		{"absolute", []ent{{name: "/etc/x", typ: tar.TypeReg, body: "x"}}},
		{"symlink then write through", []ent{
			{name: "a", typ: tar.TypeSymlink, link: "../outside"},
			{name: "a/passwd", typ: tar.TypeReg, body: "pwned"}}},
		{"absolute symlink then write through", []ent{
			{name: "etc", typ: tar.TypeSymlink, link: "/"},
			{name: "etc/passwd", typ: tar.TypeReg, body: "pwned"}}},
		{"symlink then dir through", []ent{
			{name: "a", typ: tar.TypeSymlink, link: "../outside"},
			{name: "a/sub/", typ: tar.TypeDir}}},
		{"hard link to /etc/passwd", []ent{{name: "x", typ: tar.TypeLink, link: "/etc/passwd"}}},
		{"hard link up", []ent{{name: "x", typ: tar.TypeLink, link: "../outside/passwd"}}},
		{"hard link through symlink", []ent{
			{name: "a", typ: tar.TypeSymlink, link: "../outside"},
			{name: "x", typ: tar.TypeLink, link: "a/passwd"}}},
		{"hard link to a symlink", []ent{
			{name: "a", typ: tar.TypeSymlink, link: "../outside/passwd"},
			{name: "x", typ: tar.TypeLink, link: "a"}}},
		{"hard link to a directory", []ent{{name: "d/", typ: tar.TypeDir}, {name: "x", typ: tar.TypeLink, link: "d"}}},
		{"huge name", []ent{{name: strings.Repeat("a/", 2100) + "f", typ: tar.TypeReg, body: "x"}}},
		{"huge component", []ent{{name: long, typ: tar.TypeReg, body: "x"}}},
		{"huge symlink target", []ent{{name: "l", typ: tar.TypeSymlink, link: strings.Repeat("x", 5000)}}},
		{"too many bytes", []ent{{name: "big", typ: tar.TypeReg, body: strings.Repeat("x", 2<<20)}}},
		{"file replaces a directory", []ent{{name: "d/", typ: tar.TypeDir}, {name: "d/f", typ: tar.TypeReg}, {name: "d", typ: tar.TypeReg}}},
		{"negative owner", []ent{{name: "f", typ: tar.TypeReg, uid: -1}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root, outside := sandboxDir(t)
			err := Extract(bytes.NewReader(mkTar(t, tc.ents)), FormatTar, root, lim)
			if !errors.Is(err, ErrHostileArchive) {
				t.Fatalf("err = %v, want ErrHostileArchive", err)
			}
			checkOutside(t, outside)
		})
	}
	t.Run("too many entries", func(t *testing.T) {
		root, outside := sandboxDir(t)
		var ents []ent
		for i := 0; i < 20; i++ {
			ents = append(ents, ent{name: "f" + string(rune('a'+i)), typ: tar.TypeReg})
		}
		err := Extract(bytes.NewReader(mkTar(t, ents)), FormatTar, root, Limits{MaxEntries: 10, MaxBytes: 1 << 20})
		if !errors.Is(err, ErrHostileArchive) {
			t.Fatalf("err = %v", err)
		}
		checkOutside(t, outside)
	})
	t.Run("not an archive", func(t *testing.T) {
		root, _ := sandboxDir(t)
		if err := Extract(strings.NewReader("not gzip"), FormatTarGzip, root, lim); !errors.Is(err, ErrHostileArchive) {
			t.Fatalf("err = %v", err)
		}
	})
}

// FuzzExtract: whatever the archive, nothing outside the rootfs changes
// and nothing panics. The seed corpus (testdata/fuzz/FuzzExtract) holds
// the hostile archives of TestExtractRefusesHostileArchives and a good one.
func FuzzExtract(f *testing.F) {
	f.Add(mkTar(f, []ent{{name: "a", typ: tar.TypeSymlink, link: "../outside"}, {name: "a/passwd", typ: tar.TypeReg, body: "pwned"}}))
	f.Add(mkTar(f, []ent{{name: "x", typ: tar.TypeLink, link: "../outside/passwd"}}))
	f.Fuzz(func(t *testing.T, data []byte) {
		root, outside := sandboxDir(t)
		_ = Extract(bytes.NewReader(data), FormatTar, root, Limits{MaxEntries: 200, MaxBytes: 1 << 20})
		checkOutside(t, outside)
	})
}

func TestInstallAndRemove(t *testing.T) {
	dir := t.TempDir()
	archive := filepath.Join(t.TempDir(), "a.tar")
	if err := os.WriteFile(archive, mkTar(t, []ent{{name: "etc/os-release", typ: tar.TypeReg, body: "ID=debian\n"}}), 0o644); err != nil {
		t.Fatal(err)
	}
	const digest = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	rootfs, err := Install(dir, "debian", "3", digest, archive, FormatTar, lim)
	if err != nil {
		t.Fatal(err)
	}
	if rootfs != Path(dir, "debian", "3") {
		t.Fatalf("rootfs %s", rootfs)
	}
	pub, err := Published(dir)
	if err != nil || len(pub) != 1 || pub[0].Digest != digest || pub[0].Version != "3" {
		t.Fatalf("published %+v %v", pub, err)
	}
	for _, bad := range []string{"", "..", ".x", "a/b", "-x", strings.Repeat("a", 200)} {
		if _, err := Install(dir, bad, "1", digest, archive, FormatTar, lim); err == nil {
			t.Errorf("id %q accepted", bad)
		}
		if _, err := Install(dir, "debian", bad, digest, archive, FormatTar, lim); err == nil {
			t.Errorf("version %q accepted", bad)
		}
	}
	if err := Remove(dir, "debian", "3"); err != nil {
		t.Fatal(err)
	}
	if pub, _ := Published(dir); len(pub) != 0 {
		t.Fatalf("left %+v", pub)
	}
	// A hostile archive leaves no version and no build directory.
	if err := os.WriteFile(archive, mkTar(t, []ent{{name: "../x", typ: tar.TypeReg}}), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Install(dir, "debian", "4", digest, archive, FormatTar, lim); !errors.Is(err, ErrHostileArchive) {
		t.Fatal(err)
	}
	if ents, _ := os.ReadDir(filepath.Join(dir, "debian")); len(ents) != 0 {
		t.Fatalf("left %v", ents)
	}
}
