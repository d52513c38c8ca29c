// Package template prepares the root filesystems (templates) that the
// sandbox runtime uses as the read-only lower layer of every workspace.
//
// Layout: a template version is a directory dir/<name>/<version>/rootfs. The
// runtime never writes into it (overlayfs keeps every change in the
// workspace's writable layer), so one rootfs serves every workspace of that
// version. Versions are immutable: a changed template is a new version.
//
// The default template ("default") is built on the node, without internet,
// from Debian's busybox-static (or another static busybox, see FindBusybox):
// /bin/busybox plus a symlink for each of its applets, a minimal /etc
// (passwd, group, shadow, hostname, hosts, profile, os-release), the usual
// mount points, and a copy of kibotos-guest at
// /usr/sbin/kibotos-guest (so commands inside can run `kibotos-guest
// poweroff`; PID 1 itself is the node's guest binary, which the runtime
// executes from a sealed in-memory copy). Its version is a hash of the layout, busybox and the guest, so
// EnsureDefault is cheap when nothing changed and builds a new version when
// either binary did.
//
// Adding another template: put a complete root filesystem at
// dir/<name>/<version>/rootfs, either a directory tree (for example
// `debootstrap --variant=minbase bookworm DIR/debian/12.0/rootfs`) or a
// tarball extracted there as root so that owners, modes and device nodes
// survive (`mkdir -p DIR/debian/12.0/rootfs && tar -C DIR/debian/12.0/rootfs
// --numeric-owner -xpf rootfs.tar`). Build it next to its final place and
// rename it in, so that a half-extracted tree is never used. The rootfs
// needs no init system and no kibotos-guest: the runtime supplies PID 1,
// /proc, /sys, /dev, /tmp and /run. Path gives the directory of a version.
//
// Published templates (ctrl's ArtifactService) arrive as tar or tar.gz
// archives verified by digest; Install extracts one into the same layout
// (publish.go), refusing whatever in the archive would reach outside the
// rootfs (extract.go), and records its digest beside the rootfs.
package template

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/kibotos/kibotos/internal/node/staticbin"
)

// DefaultName is the name of the default template.
const DefaultName = "default"

// layoutVersion changes whenever EnsureDefault lays the rootfs out
// differently, so that a new layout gets a new version.
const layoutVersion = "1"

// busyboxCandidates are where Debian's busybox-static installs busybox.
var busyboxCandidates = []string{"/bin/busybox", "/usr/bin/busybox"}

// ErrBusyboxMissing reports that no static busybox is installed (test with
// errors.Is; the error says where it looked).
var ErrBusyboxMissing = errors.New("template: the default template needs a static busybox: apt-get install busybox-static")

// Path returns the rootfs directory of a template version.
func Path(dir, name, version string) string {
	return filepath.Join(dir, name, version, "rootfs")
}

// FindBusybox returns the static busybox the default template is built
// from: path when it is not empty, else the first static one where Debian's
// busybox-static installs it. A missing or dynamic busybox is
// ErrBusyboxMissing.
func FindBusybox(path string) (string, error) {
	if path != "" {
		if err := staticbin.Check(path); err != nil {
			return "", fmt.Errorf("%w (%v)", ErrBusyboxMissing, err)
		}
		return path, nil
	}
	for _, p := range busyboxCandidates {
		if staticbin.Check(p) == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("%w (no static busybox at %s)", ErrBusyboxMissing, strings.Join(busyboxCandidates, " or "))
}

// EnsureDefault returns the rootfs of the default template in dir, building
// it first when this version does not exist yet. guestBinary, when not empty,
// is copied to /usr/sbin/kibotos-guest; busybox is as for FindBusybox.
// Concurrent callers are safe: each builds aside and the first rename wins.
func EnsureDefault(dir, guestBinary, busybox string) (string, error) {
	busybox, err := FindBusybox(busybox)
	if err != nil {
		return "", err
	}
	version, err := defaultVersion(busybox, guestBinary)
	if err != nil {
		return "", err
	}
	return buildAside(dir, DefaultName, version, func(build string) error {
		if err := buildDefault(filepath.Join(build, "rootfs"), busybox, guestBinary, version); err != nil {
			return fmt.Errorf("template: build default %s: %w", version, err)
		}
		return nil
	})
}

// buildAside returns the rootfs of version version of template name in
// dir, made first when it is not there: fill lays the version's directory
// out (its rootfs, and any file beside it) in a build directory next to
// its final place, which is then renamed in, so that a half-made version
// is never seen. Concurrent callers are safe: the first rename wins and the
// others return its rootfs.
func buildAside(dir, name, version string, fill func(build string) error) (string, error) {
	final := filepath.Join(dir, name, version)
	rootfs := filepath.Join(final, "rootfs")
	if fi, err := os.Stat(rootfs); err == nil && fi.IsDir() {
		return rootfs, nil
	}
	parent := filepath.Join(dir, name)
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return "", err
	}
	var rnd [6]byte
	_, _ = rand.Read(rnd[:])
	build := filepath.Join(parent, ".build-"+hex.EncodeToString(rnd[:]))
	defer os.RemoveAll(build)
	if err := fill(build); err != nil {
		return "", err
	}
	if err := os.Rename(build, final); err != nil {
		if fi, err2 := os.Stat(rootfs); err2 == nil && fi.IsDir() {
			return rootfs, nil // another caller won
		}
		return "", fmt.Errorf("template: %w", err)
	}
	return rootfs, nil
}

func defaultVersion(busybox, guest string) (string, error) {
	h := sha256.New()
	fmt.Fprintf(h, "kibotos default template layout %s\n", layoutVersion)
	for _, p := range []string{busybox, guest} {
		if p == "" {
			fmt.Fprintf(h, "none\n")
			continue
		}
		f, err := os.Open(p)
		if err != nil {
			return "", fmt.Errorf("template: %w", err)
		}
		n, err := io.Copy(h, f)
		f.Close()
		if err != nil {
			return "", fmt.Errorf("template: read %s: %w", p, err)
		}
		fmt.Fprintf(h, "\n%d\n", n)
	}
	return "v" + layoutVersion + "-" + hex.EncodeToString(h.Sum(nil))[:16], nil
}

func buildDefault(rootfs, busybox, guest, version string) error {
	dirs := []struct {
		path string
		mode os.FileMode
	}{
		{"bin", 0o755}, {"sbin", 0o755}, {"usr/bin", 0o755}, {"usr/sbin", 0o755},
		{"usr/local/bin", 0o755}, {"usr/local/sbin", 0o755}, {"etc", 0o755},
		{"proc", 0o555}, {"sys", 0o555}, {"dev", 0o755}, {"run", 0o755},
		{"tmp", os.ModeSticky | 0o777}, {"var/tmp", os.ModeSticky | 0o777}, {"var/log", 0o755}, {"root", 0o700},
		{"home", 0o755}, {"mnt", 0o755}, {"lib", 0o755},
	}
	for _, d := range dirs {
		p := filepath.Join(rootfs, d.path)
		if err := os.MkdirAll(p, 0o755); err != nil {
			return err
		}
		if err := os.Chmod(p, d.mode); err != nil {
			return err
		}
	}
	if err := copyFile(busybox, filepath.Join(rootfs, "bin/busybox"), 0o755); err != nil {
		return err
	}
	out, err := exec.Command(busybox, "--list-full").Output()
	if err != nil {
		return fmt.Errorf("busybox --list-full: %w", err)
	}
	for _, applet := range strings.Fields(string(out)) {
		applet = strings.TrimPrefix(filepath.Clean("/"+applet), "/")
		if applet == "bin/busybox" || applet == "" {
			continue
		}
		p := filepath.Join(rootfs, applet)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		if err := os.Symlink("/bin/busybox", p); err != nil && !errors.Is(err, os.ErrExist) {
			return err
		}
	}
	if guest != "" {
		if err := copyFile(guest, filepath.Join(rootfs, "usr/sbin/kibotos-guest"), 0o755); err != nil {
			return err
		}
	}
	files := []struct {
		path, content string
		mode          os.FileMode
	}{
		{"etc/passwd", "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n", 0o644},
		{"etc/group", "root:x:0:\ntty:x:5:\nusers:x:100:\nnogroup:x:65534:\n", 0o644},
		{"etc/shadow", "root:*:19000:0:99999:7:::\nnobody:*:19000:0:99999:7:::\n", 0o640},
		{"etc/hostname", "workspace\n", 0o644},
		{"etc/hosts", "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n", 0o644},
		{"etc/profile", "export PATH=" + "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" + "\nexport HOME=${HOME:-/root}\nPS1='\\u@\\h:\\w\\$ '\n", 0o644},
		{"etc/os-release", "NAME=\"Kibotos default\"\nID=kibotos-default\nVERSION_ID=\"" + version + "\"\nPRETTY_NAME=\"Kibotos default template (busybox) " + version + "\"\n", 0o644},
		{"etc/kibotos-template", "name=" + DefaultName + "\nversion=" + version + "\n", 0o644},
	}
	for _, f := range files {
		if err := os.WriteFile(filepath.Join(rootfs, f.path), []byte(f.content), f.mode); err != nil {
			return err
		}
		if err := os.Chmod(filepath.Join(rootfs, f.path), f.mode); err != nil {
			return err
		}
	}
	return syncTree(rootfs)
}

func copyFile(src, dst string, mode os.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, mode)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	if err := out.Close(); err != nil {
		return err
	}
	return os.Chmod(dst, mode)
}

// syncTree flushes the new tree's filesystem before it is renamed in, so a
// crash never leaves a published version with empty files.
func syncTree(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return syncfs(f)
}

// Version reads the version recorded in a rootfs built by EnsureDefault.
func Version(rootfs string) (string, error) {
	b, err := os.ReadFile(filepath.Join(rootfs, "etc/kibotos-template"))
	if err != nil {
		return "", err
	}
	for _, line := range bytes.Split(b, []byte("\n")) {
		if v, ok := bytes.CutPrefix(line, []byte("version=")); ok {
			return string(v), nil
		}
	}
	return "", fmt.Errorf("template: no version in %s", rootfs)
}

// Info is one template a node can start workspaces from.
type Info struct {
	Name    string
	Version string
	Rootfs  string
	// Digest is a published version's digest (Install); empty for one
	// built on the node or installed by hand.
	Digest string
}

// installed is one installed version of a template: its directory entry
// and rootfs.
type installed struct {
	entry os.DirEntry
	info  Info
}

// eachTemplate calls fn, for each template under dir, with its versions
// that have a rootfs (with their recorded digest, if any). Build and
// removal directories (".*") are ignored.
func eachTemplate(dir string, fn func(name string, versions []installed)) error {
	names, err := os.ReadDir(dir)
	if err != nil {
		if os.IsNotExist(err) {
			return nil
		}
		return err
	}
	for _, n := range names {
		if !n.IsDir() || strings.HasPrefix(n.Name(), ".") {
			continue
		}
		entries, err := os.ReadDir(filepath.Join(dir, n.Name()))
		if err != nil {
			return err
		}
		var vs []installed
		for _, v := range entries {
			if !v.IsDir() || strings.HasPrefix(v.Name(), ".") {
				continue
			}
			rootfs := Path(dir, n.Name(), v.Name())
			if fi, err := os.Stat(rootfs); err != nil || !fi.IsDir() {
				continue
			}
			info := Info{Name: n.Name(), Version: v.Name(), Rootfs: rootfs}
			if d, err := os.ReadFile(filepath.Join(dir, n.Name(), v.Name(), digestFile)); err == nil {
				info.Digest = strings.TrimSpace(string(d))
			}
			vs = append(vs, installed{entry: v, info: info})
		}
		fn(n.Name(), vs)
	}
	return nil
}

// List returns the templates under dir: for each name, the version whose
// rootfs was installed last (by the version directory's modification time;
// ties go to the greater version string). Build directories (".build-*")
// and versions without a rootfs are ignored.
func List(dir string) ([]Info, error) {
	var out []Info
	err := eachTemplate(dir, func(_ string, versions []installed) {
		var best *Info
		var bestTime int64
		for i, v := range versions {
			fi, err := v.entry.Info()
			if err != nil {
				continue
			}
			t := fi.ModTime().UnixNano()
			if best == nil || t > bestTime || (t == bestTime && v.info.Version > best.Version) {
				best, bestTime = &versions[i].info, t
			}
		}
		if best != nil {
			out = append(out, *best)
		}
	})
	return out, err
}
