package sandbox

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// Layer seeds.
//
// Formatting a layer (mkfs.ext4 of a sparse file) costs a process spawn and
// ~15 ms. Every layer of one capacity starts out identical, so the runtime
// keeps one formatted image per capacity, Root/layer-seeds/<capacity>.img,
// and creates a layer by cloning it: FICLONE (a reflink) where the
// filesystem has it, else a copy of the seed's data extents only
// (SEEK_DATA/SEEK_HOLE, copy_file_range), which keeps the clone exactly as
// sparse as the seed (~150 KiB of data for a 64 MiB layer). A seed is made
// with the same mkfs.ext4 as a layer, fsync'd and renamed in, so a seed
// that exists is complete. Seeds are kept like layers: Leaks and Cleanup
// neither report nor remove them.
//
// Seeds are only an optimization: a missing, unusable or uncloneable seed
// makes the layer with mkfs.ext4 as before. Concurrent first starts of one
// capacity (in one process or several) are safe: every seed is built under a
// unique name and renamed in atomically, and a clone reads a file descriptor
// of a complete seed even if another builder renames a new one over it.
//
// Clones share the seed's filesystem UUID (and directory hash seed). A fresh
// UUID would cost `tune2fs -U random`, which with metadata_csum rewrites every
// metadata checksum: ~20 ms measured, more than the clone saves. Duplicate
// UUIDs are harmless here: a layer is only ever attached to a loop device by
// path and mounted by device (never by UUID or LABEL, never listed in fstab
// or blkid-driven automounts), and ext4 itself does not care.

const seedDirName = "layer-seeds"

// seedStaleAfter is the age after which an abandoned seed build (a crash
// between create and rename) is removed.
const seedStaleAfter = 10 * time.Minute

// seedLocks serialises seed builds of one seed path within the process;
// other processes are covered by the atomic rename.
var (
	seedLocks sync.Map // seed path -> *sync.Mutex
	seedSeq   atomic.Uint64
)

// mkfsLayer makes path (which must not exist) a sparse file of exactly
// capacity bytes holding a fresh ext4 filesystem, and fsyncs it.
func mkfsLayer(ctx context.Context, path string, capacity uint64) error {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return err
	}
	if err := f.Truncate(int64(capacity)); err != nil {
		f.Close()
		return err
	}
	f.Close()
	// 4 KiB blocks even on small images (mke2fs would pick 1 KiB), one
	// inode per 8 KiB, no reserved blocks: the workspace's root owns it all.
	out, _, err := runTool(ctx, "mkfs.ext4", "-q", "-F", "-b", "4096", "-i", "8192", "-m", "0",
		"-L", "kibotos-layer", "-E", "lazy_itable_init=1,lazy_journal_init=1,nodiscard", path)
	if err != nil {
		return fmt.Errorf("sandbox: mkfs.ext4 %s: %v: %s", path, err, bytes.TrimSpace(out))
	}
	f, err = os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

// CreateLayerImage makes a writable layer image exactly as the runtime does
// on a workspace's first start (see createLayerImage), with the seeds kept in
// seedDir. Benchmarks use it to give a reference runtime the same layer.
func CreateLayerImage(ctx context.Context, seedDir, path string, capacity uint64) error {
	_, _, err := createLayerImage(ctx, seedDir, path, capacity)
	return err
}

// createLayerImage creates the layer image path of capacity bytes: built
// aside (path.new), fsync'd and renamed in, so path is never a half image.
// With seedDir it clones the seed of capacity (made on first use), falling
// back to mkfs.ext4 on any failure; without, it always runs mkfs.ext4. It
// returns whether a seed was used and, if a seed failed, why.
func createLayerImage(ctx context.Context, seedDir, path string, capacity uint64) (seeded bool, seedErr, err error) {
	tmp := layerTmpPath(path)
	_ = os.Remove(tmp)
	if seedDir != "" {
		if seedErr = cloneFromSeed(ctx, seedDir, tmp, capacity); seedErr == nil {
			seeded = true
		} else {
			_ = os.Remove(tmp)
		}
	}
	if !seeded {
		if err := mkfsLayer(ctx, tmp, capacity); err != nil {
			os.Remove(tmp)
			return false, seedErr, err
		}
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return false, seedErr, err
	}
	return seeded, seedErr, syncDir(filepath.Dir(path))
}

// cloneFromSeed makes dst (which must not exist) a clone of the seed of
// capacity, building the seed first if needed, and fsyncs it.
func cloneFromSeed(ctx context.Context, seedDir, dst string, capacity uint64) error {
	src, err := openSeed(ctx, seedDir, capacity)
	if err != nil {
		return err
	}
	defer src.Close()
	out, err := os.OpenFile(dst, os.O_RDWR|os.O_CREATE|os.O_EXCL|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return err
	}
	defer out.Close()
	if err := cloneFile(out, src, int64(capacity)); err != nil {
		return err
	}
	return out.Sync()
}

// openSeed opens the seed of capacity after checking it (size and ext4
// superblock), building it when missing and replacing it when unusable.
func openSeed(ctx context.Context, seedDir string, capacity uint64) (*os.File, error) {
	p := seedPath(seedDir, capacity)
	if f, err := openValidSeed(p, capacity); err == nil {
		return f, nil
	}
	mu, _ := seedLocks.LoadOrStore(p, new(sync.Mutex))
	mu.(*sync.Mutex).Lock()
	defer mu.(*sync.Mutex).Unlock()
	// Another goroutine may have built it meanwhile.
	if f, err := openValidSeed(p, capacity); err == nil {
		return f, nil
	}
	if err := buildSeed(ctx, seedDir, p, capacity); err != nil {
		return nil, err
	}
	return openValidSeed(p, capacity)
}

func openValidSeed(p string, capacity uint64) (*os.File, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, err
	}
	fi, err := f.Stat()
	if err == nil && (!fi.Mode().IsRegular() || uint64(fi.Size()) != capacity) {
		err = fmt.Errorf("sandbox: seed %s is %d bytes, want %d", p, fi.Size(), capacity)
	}
	if err == nil {
		var fs uint64
		if fs, err = ext4SizeOf(f, p); err == nil && fs != capacity {
			err = fmt.Errorf("sandbox: seed %s holds a %d byte filesystem, want %d", p, fs, capacity)
		}
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// buildSeed formats a seed under a unique name and renames it to p.
func buildSeed(ctx context.Context, seedDir, p string, capacity uint64) error {
	if err := os.MkdirAll(seedDir, 0o700); err != nil {
		return err
	}
	removeStaleSeedBuilds(seedDir)
	tmp := filepath.Join(seedDir, fmt.Sprintf(".%s.%d.%d.%d", filepath.Base(p), os.Getpid(), time.Now().UnixNano(), seedSeq.Add(1)))
	if err := mkfsLayer(ctx, tmp, capacity); err != nil {
		os.Remove(tmp)
		return err
	}
	if err := os.Rename(tmp, p); err != nil {
		os.Remove(tmp)
		return err
	}
	return syncDir(seedDir)
}

// removeStaleSeedBuilds removes seed builds abandoned by a crash.
func removeStaleSeedBuilds(seedDir string) {
	ents, _ := os.ReadDir(seedDir)
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), ".") {
			continue
		}
		if fi, err := e.Info(); err == nil && time.Since(fi.ModTime()) > seedStaleAfter {
			_ = os.Remove(filepath.Join(seedDir, e.Name()))
		}
	}
}

// cloneFile makes dst (empty) an exact copy of the first size bytes of src
// (which is size bytes): a reflink if the filesystem can, else a copy of
// src's data extents that leaves its holes as holes.
func cloneFile(dst, src *os.File, size int64) error {
	if unix.IoctlFileClone(int(dst.Fd()), int(src.Fd())) == nil {
		return nil
	}
	if err := dst.Truncate(size); err != nil {
		return err
	}
	sfd := int(src.Fd())
	for off := int64(0); off < size; {
		data, err := unix.Seek(sfd, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) || (err == nil && data >= size) {
			break // only a hole remains
		}
		if err != nil {
			return fmt.Errorf("sandbox: SEEK_DATA: %w", err)
		}
		hole, err := unix.Seek(sfd, data, unix.SEEK_HOLE)
		if err != nil {
			return fmt.Errorf("sandbox: SEEK_HOLE: %w", err)
		}
		hole = min(hole, size)
		if err := copyRange(dst, src, data, hole-data); err != nil {
			return err
		}
		off = hole
	}
	return nil
}

// copyRange copies n bytes at off from src to the same offset of dst:
// copy_file_range, else read and write.
func copyRange(dst, src *os.File, off, n int64) error {
	roff, woff := off, off
	end := off + n
	for roff < end {
		c, err := unix.CopyFileRange(int(src.Fd()), &roff, int(dst.Fd()), &woff, int(end-roff), 0)
		if err != nil {
			if errors.Is(err, unix.EINTR) {
				continue
			}
			if errors.Is(err, unix.EXDEV) || errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EINVAL) ||
				errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.EBADF) {
				return copyRangeRW(dst, src, roff, end-roff)
			}
			return fmt.Errorf("sandbox: copy_file_range: %w", err)
		}
		if c == 0 {
			return fmt.Errorf("sandbox: copy_file_range: unexpected end of seed at %d", roff)
		}
	}
	return nil
}

func copyRangeRW(dst, src *os.File, off, n int64) error {
	w := io.NewOffsetWriter(dst, off)
	_, err := io.Copy(w, io.NewSectionReader(src, off, n))
	return err
}
