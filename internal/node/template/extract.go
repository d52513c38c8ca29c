package template

import (
	"archive/tar"
	"bufio"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strings"

	"golang.org/x/sys/unix"
)

// Extraction of a published template archive (a tar, or a gzip-compressed
// tar) into a rootfs. The archive is hostile input even though an
// operator published it: every entry is created relative to a descriptor
// of the rootfs, its parent directory resolved with openat2
// RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS (no '..' escape, no symlink followed,
// not even one an earlier entry made), and its last component never
// followed either (O_NOFOLLOW, AT_SYMLINK_NOFOLLOW, an existing entry is
// replaced, not written through).
//
// Kept: regular files, directories, symlinks (their targets are only text:
// the workspace resolves them inside its own root), hard links to regular
// files extracted before, FIFOs, numeric owners (uid, gid), modes with the
// setuid, setgid and sticky bits, modification times of files. Skipped:
// character and block devices (the runtime supplies /dev, and the overlay
// root is mounted nodev), extended headers' xattrs. Refused (the whole
// archive): absolute names, names with a '..' component or NUL, names and
// link targets over the bounds, more entries or more bytes than Limits,
// hard links that leave the archive's tree or name a directory or symlink.

// Limits bound an extraction.
type Limits struct {
	// MaxEntries bounds the entries (DefaultMaxEntries when 0).
	MaxEntries int
	// MaxBytes bounds the bytes of the regular files together (required:
	// the free space the rootfs may take).
	MaxBytes uint64
}

// DefaultMaxEntries bounds an archive's entries.
const DefaultMaxEntries = 2_000_000

// MaxNameBytes bounds an entry's name and a link's target.
const MaxNameBytes = 4096

// maxComponentBytes is NAME_MAX.
const maxComponentBytes = 255

// ErrHostileArchive marks an archive refused for what it holds (test with
// errors.Is): no retry of it can succeed.
var ErrHostileArchive = errors.New("template: archive refused")

// Format of an archive.
type Format int

// The archive formats.
const (
	FormatTar Format = iota + 1
	FormatTarGzip
)

// Extract unpacks the archive r (in format f) into the directory rootfs,
// which exists and is empty, within lim.
func Extract(r io.Reader, f Format, rootfs string, lim Limits) error {
	if lim.MaxEntries <= 0 {
		lim.MaxEntries = DefaultMaxEntries
	}
	switch f {
	case FormatTar:
	case FormatTarGzip:
		zr, err := gzip.NewReader(bufio.NewReader(r))
		if err != nil {
			return fmt.Errorf("%w: gzip: %v", ErrHostileArchive, err)
		}
		defer zr.Close()
		r = zr
	default:
		return fmt.Errorf("%w: unknown format %d", ErrHostileArchive, f)
	}
	root, err := unix.Open(rootfs, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("template: open %s: %w", rootfs, err)
	}
	defer unix.Close(root)
	x := &extractor{root: root, lim: lim, chown: os.Geteuid() == 0}
	tr := tar.NewReader(r)
	for n := 0; ; n++ {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return fmt.Errorf("%w: entry %d: %v", ErrHostileArchive, n+1, err)
		}
		if n >= lim.MaxEntries {
			return fmt.Errorf("%w: more than %d entries", ErrHostileArchive, lim.MaxEntries)
		}
		if err := x.entry(hdr, tr); err != nil {
			return fmt.Errorf("template: entry %d (%q): %w", n+1, cutName(hdr.Name), err)
		}
	}
	return x.finish()
}

func cutName(s string) string {
	if len(s) > 120 {
		return s[:120] + "…"
	}
	return s
}

// copyBuffer is the piece a regular file's bytes are copied in.
const copyBuffer = 1 << 20

// writeBackMin: the write-back of a regular file of at least so many bytes
// is started as soon as it is written.
const writeBackMin = 1 << 20

// onlyWriter hides *os.File's ReadFrom, which would copy with io.Copy's
// 32 KiB buffer instead of the extractor's.
type onlyWriter struct{ io.Writer }

type extractor struct {
	buf   []byte
	root  int
	lim   Limits
	bytes uint64
	chown bool
	// dirs are the directories whose mode is set at the end (a directory
	// without write permission still takes its entries as root, but one
	// made read-only for an unprivileged extractor would not).
	dirs []dirMode
}

type dirMode struct {
	rel  string
	mode uint32
}

// cleanName checks an entry name (or hard link target) and returns it
// relative to the root: "" is the root itself.
func cleanName(name string) (string, error) {
	if len(name) > MaxNameBytes {
		return "", fmt.Errorf("%w: a name of %d bytes (at most %d)", ErrHostileArchive, len(name), MaxNameBytes)
	}
	if strings.IndexByte(name, 0) >= 0 {
		return "", fmt.Errorf("%w: a name with NUL", ErrHostileArchive)
	}
	if strings.HasPrefix(name, "/") {
		return "", fmt.Errorf("%w: absolute name", ErrHostileArchive)
	}
	var parts []string
	for _, c := range strings.Split(name, "/") {
		switch c {
		case "", ".":
			continue
		case "..":
			return "", fmt.Errorf("%w: a name with '..'", ErrHostileArchive)
		}
		if len(c) > maxComponentBytes {
			return "", fmt.Errorf("%w: a name component of %d bytes (at most %d)", ErrHostileArchive, len(c), maxComponentBytes)
		}
		parts = append(parts, c)
	}
	return strings.Join(parts, "/"), nil
}

const resolveHow = unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV

// openBeneath opens rel (relative, clean) beneath the root without
// following any symlink.
func (x *extractor) openBeneath(rel string, flags uint64) (int, error) {
	if rel == "" {
		rel = "."
	}
	return unix.Openat2(x.root, rel, &unix.OpenHow{Flags: flags | unix.O_CLOEXEC | unix.O_NOFOLLOW, Resolve: resolveHow})
}

// parent returns a descriptor of rel's parent directory, made (0755,
// owned by root) where missing, and rel's last component.
func (x *extractor) parent(rel string) (int, string, error) {
	dir, base := path.Split(rel)
	dir = strings.TrimSuffix(dir, "/")
	fd, err := x.mkdirAll(dir)
	return fd, base, err
}

// mkdirAll returns a descriptor (O_PATH) of directory rel, made where
// missing, component by component, beneath the root.
func (x *extractor) mkdirAll(rel string) (int, error) {
	fd, err := unix.Dup(x.root)
	if err != nil {
		return -1, err
	}
	if rel == "" {
		return fd, nil
	}
	for _, c := range strings.Split(rel, "/") {
		next, err := unix.Openat2(fd, c, &unix.OpenHow{Flags: unix.O_PATH | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC, Resolve: resolveHow})
		if errors.Is(err, unix.ENOENT) {
			if err := unix.Mkdirat(fd, c, 0o755); err != nil && !errors.Is(err, unix.EEXIST) {
				unix.Close(fd)
				return -1, err
			}
			next, err = unix.Openat2(fd, c, &unix.OpenHow{Flags: unix.O_PATH | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC, Resolve: resolveHow})
		}
		unix.Close(fd)
		if err != nil {
			if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.EXDEV) {
				return -1, fmt.Errorf("%w: a parent is not a directory (a symlink or file)", ErrHostileArchive)
			}
			return -1, err
		}
		fd = next
	}
	return fd, nil
}

// clear removes what is at name in dir unless it is a directory and keep
// is set (a later entry replaces an earlier one, as tar does).
func clear(dir int, name string, keepDir bool) error {
	var st unix.Stat_t
	if err := unix.Fstatat(dir, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil
		}
		return err
	}
	if st.Mode&unix.S_IFMT == unix.S_IFDIR {
		if keepDir {
			return nil
		}
		return fmt.Errorf("%w: an entry replaces a directory", ErrHostileArchive)
	}
	return unix.Unlinkat(dir, name, 0)
}

func (x *extractor) entry(hdr *tar.Header, body io.Reader) error {
	rel, err := cleanName(hdr.Name)
	if err != nil {
		return err
	}
	if hdr.Uid < 0 || hdr.Gid < 0 || hdr.Uid > 1<<32-2 || hdr.Gid > 1<<32-2 {
		return fmt.Errorf("%w: owner %d:%d", ErrHostileArchive, hdr.Uid, hdr.Gid)
	}
	mode := uint32(hdr.Mode) & 0o7777
	if rel == "" {
		if hdr.Typeflag != tar.TypeDir {
			return fmt.Errorf("%w: the root is not a directory", ErrHostileArchive)
		}
		if err := x.own(x.root, "", hdr, unix.AT_EMPTY_PATH); err != nil {
			return err
		}
		x.dirs = append(x.dirs, dirMode{"", mode})
		return nil
	}
	dir, name, err := x.parent(rel)
	if err != nil {
		return err
	}
	defer unix.Close(dir)
	switch hdr.Typeflag {
	case tar.TypeDir:
		if err := clear(dir, name, true); err != nil {
			return err
		}
		if err := unix.Mkdirat(dir, name, 0o755); err != nil && !errors.Is(err, unix.EEXIST) {
			return err
		}
		if err := x.own(dir, name, hdr, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return err
		}
		x.dirs = append(x.dirs, dirMode{rel, mode})
	case tar.TypeReg, tar.TypeRegA:
		if hdr.Size < 0 || uint64(hdr.Size) > x.lim.MaxBytes-x.bytes {
			return fmt.Errorf("%w: more than %d bytes of files", ErrHostileArchive, x.lim.MaxBytes)
		}
		x.bytes += uint64(hdr.Size)
		if err := clear(dir, name, false); err != nil {
			return err
		}
		fd, err := unix.Openat(dir, name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
		if err != nil {
			return err
		}
		f := os.NewFile(uintptr(fd), name)
		defer f.Close()
		// In pieces of copyBuffer (io.CopyN's 32 KiB take 32 times the
		// system calls), the write-back of a large file started at once
		// (the syncfs before the rename-in then finds little left).
		if x.buf == nil {
			x.buf = make([]byte, copyBuffer)
		}
		if n, err := io.CopyBuffer(onlyWriter{f}, io.LimitReader(body, hdr.Size), x.buf); err != nil || n != hdr.Size {
			if err == nil {
				err = io.ErrUnexpectedEOF
			}
			return fmt.Errorf("write (%d of %d bytes): %w", n, hdr.Size, err)
		}
		if hdr.Size >= writeBackMin {
			_ = unix.SyncFileRange(fd, 0, 0, unix.SYNC_FILE_RANGE_WRITE)
		}
		if x.chown {
			if err := unix.Fchown(fd, hdr.Uid, hdr.Gid); err != nil {
				return err
			}
		}
		// After the chown, which clears setuid and setgid.
		if err := unix.Fchmod(fd, mode); err != nil {
			return err
		}
		mt := unix.NsecToTimespec(hdr.ModTime.UnixNano())
		_ = unix.UtimesNanoAt(fd, "", []unix.Timespec{mt, mt}, unix.AT_EMPTY_PATH)
		return f.Close()
	case tar.TypeSymlink:
		if len(hdr.Linkname) > MaxNameBytes || hdr.Linkname == "" || strings.IndexByte(hdr.Linkname, 0) >= 0 {
			return fmt.Errorf("%w: symlink target of %d bytes", ErrHostileArchive, len(hdr.Linkname))
		}
		if err := clear(dir, name, false); err != nil {
			return err
		}
		if err := unix.Symlinkat(hdr.Linkname, dir, name); err != nil {
			return err
		}
		if x.chown {
			if err := unix.Fchownat(dir, name, hdr.Uid, hdr.Gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
				return err
			}
		}
		mt := unix.NsecToTimespec(hdr.ModTime.UnixNano())
		_ = unix.UtimesNanoAt(dir, name, []unix.Timespec{mt, mt}, unix.AT_SYMLINK_NOFOLLOW)
	case tar.TypeLink:
		target, err := cleanName(hdr.Linkname)
		if err != nil || target == "" {
			return fmt.Errorf("%w: hard link to %q", ErrHostileArchive, cutName(hdr.Linkname))
		}
		tfd, err := x.openBeneath(target, unix.O_PATH)
		if err != nil {
			return fmt.Errorf("%w: hard link to %q: %v", ErrHostileArchive, cutName(hdr.Linkname), err)
		}
		defer unix.Close(tfd)
		var st unix.Stat_t
		if err := unix.Fstat(tfd, &st); err != nil {
			return err
		}
		if st.Mode&unix.S_IFMT != unix.S_IFREG {
			return fmt.Errorf("%w: hard link to %q, which is not a regular file", ErrHostileArchive, cutName(hdr.Linkname))
		}
		if err := clear(dir, name, false); err != nil {
			return err
		}
		if err := unix.Linkat(tfd, "", dir, name, unix.AT_EMPTY_PATH); err != nil {
			// AT_EMPTY_PATH needs CAP_DAC_READ_SEARCH; without it, the
			// descriptor's magic link names the same inode.
			if err2 := unix.Linkat(unix.AT_FDCWD, fmt.Sprintf("/proc/self/fd/%d", tfd), dir, name, unix.AT_SYMLINK_FOLLOW); err2 != nil {
				return err
			}
		}
	case tar.TypeFifo:
		if err := clear(dir, name, false); err != nil {
			return err
		}
		if err := unix.Mknodat(dir, name, unix.S_IFIFO|0o600, 0); err != nil {
			return err
		}
		if err := x.own(dir, name, hdr, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return err
		}
		if err := unix.Fchmodat(dir, name, mode, 0); err != nil {
			return err
		}
	case tar.TypeChar, tar.TypeBlock:
		// Skipped: the runtime supplies /dev.
	case tar.TypeXGlobalHeader:
	default:
		// GNU long names and PAX headers are read by archive/tar; other
		// types (sparse, volume labels) are skipped.
	}
	return nil
}

// own sets the owner of name in dir (the directory itself with
// AT_EMPTY_PATH) when the extraction runs as root.
func (x *extractor) own(dir int, name string, hdr *tar.Header, flags int) error {
	if !x.chown {
		return nil
	}
	return unix.Fchownat(dir, name, hdr.Uid, hdr.Gid, flags)
}

// finish sets the directories' modes, deepest last set first so that a
// read-only directory does not stop its children's.
func (x *extractor) finish() error {
	for i := len(x.dirs) - 1; i >= 0; i-- {
		d := x.dirs[i]
		fd, err := x.openBeneath(d.rel, unix.O_RDONLY|unix.O_DIRECTORY)
		if err != nil {
			if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) {
				continue // replaced by a later entry
			}
			return err
		}
		err = unix.Fchmod(fd, d.mode)
		unix.Close(fd)
		if err != nil {
			return err
		}
	}
	return nil
}
