package sandbox

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// MinCapacityBytes is the smallest writable layer (ext4 with a journal).
const MinCapacityBytes = 16 << 20

const mib = 1 << 20

func (r *Runtime) layerPath(ws string) string { return filepath.Join(r.root, "layers", ws+".img") }

func checkCapacity(c uint64) error {
	if c%mib != 0 {
		return fmt.Errorf("%w: %d bytes is not a whole number of MiB", ErrCapacity, c)
	}
	if c < MinCapacityBytes {
		return fmt.Errorf("%w: %d bytes is below the minimum of %d", ErrCapacity, c, MinCapacityBytes)
	}
	return nil
}

// findTool finds an e2fsprogs binary in PATH or the sbin directories (PATH
// of a non-login shell may lack them).
func findTool(name string) (string, error) {
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	for _, d := range []string{"/usr/sbin", "/sbin", "/usr/bin", "/bin"} {
		p := filepath.Join(d, name)
		if fi, err := os.Stat(p); err == nil && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("sandbox: %s not found (apt-get install e2fsprogs)", name)
}

func runTool(ctx context.Context, name string, args ...string) ([]byte, int, error) {
	p, err := findTool(name)
	if err != nil {
		return nil, -1, err
	}
	cmd := exec.CommandContext(ctx, p, args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err = cmd.Run()
	code := -1
	if cmd.ProcessState != nil {
		code = cmd.ProcessState.ExitCode()
	}
	return out.Bytes(), code, err
}

// ensureLayer creates the writable layer image when it does not exist: a
// sparse file of exactly capacity bytes with an ext4 filesystem, made aside
// and renamed in. It returns whether it created it.
func (r *Runtime) ensureLayer(ctx context.Context, ws string, capacity uint64) (bool, error) {
	path := r.layerPath(ws)
	if _, err := os.Stat(path); err == nil {
		return false, nil
	} else if !errors.Is(err, os.ErrNotExist) {
		return false, err
	}
	tmp := path + ".new"
	_ = os.Remove(tmp)
	f, err := os.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_EXCL|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return false, err
	}
	if err := f.Truncate(int64(capacity)); err != nil {
		f.Close()
		os.Remove(tmp)
		return false, err
	}
	f.Close()
	// 4 KiB blocks even on small images (mke2fs would pick 1 KiB), one
	// inode per 8 KiB, no reserved blocks: the workspace's root owns it all.
	out, _, err := runTool(ctx, "mkfs.ext4", "-q", "-F", "-b", "4096", "-i", "8192", "-m", "0",
		"-L", "kibotos-layer", "-E", "lazy_itable_init=1,lazy_journal_init=1,nodiscard", tmp)
	if err != nil {
		os.Remove(tmp)
		return false, fmt.Errorf("sandbox: mkfs.ext4 %s: %v: %s", tmp, err, bytes.TrimSpace(out))
	}
	if f, err := os.Open(tmp); err == nil {
		_ = f.Sync()
		f.Close()
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return false, err
	}
	return true, syncDir(filepath.Dir(path))
}

// ext4Size reads the filesystem size from the ext4 superblock of image.
func ext4Size(image string) (uint64, error) {
	f, err := os.Open(image)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sb := make([]byte, 1024)
	if _, err := f.ReadAt(sb, 1024); err != nil {
		return 0, err
	}
	le := binary.LittleEndian
	if le.Uint16(sb[0x38:]) != 0xEF53 {
		return 0, fmt.Errorf("sandbox: %s has no ext4 superblock", image)
	}
	blocks := uint64(le.Uint32(sb[0x4:]))
	if le.Uint32(sb[0x60:])&0x80 != 0 { // INCOMPAT_64BIT
		blocks |= uint64(le.Uint32(sb[0x150:])) << 32
	}
	return blocks * (1024 << le.Uint32(sb[0x18:])), nil
}

// growLayer grows image to capacity and its filesystem to the file: offline
// (e2fsck -f, then resize2fs), so only without execution. An interrupted
// grow (file grown, filesystem not) is finished by the next call.
func growLayer(ctx context.Context, image string, capacity uint64) error {
	fi, err := os.Stat(image)
	if err != nil {
		return err
	}
	cur := uint64(fi.Size())
	if capacity < cur {
		return fmt.Errorf("%w: %d bytes is smaller than the layer's %d", ErrCapacity, capacity, cur)
	}
	fs, err := ext4Size(image)
	if err != nil {
		return err
	}
	if capacity == cur && fs == cur {
		return nil
	}
	if capacity > cur {
		if err := os.Truncate(image, int64(capacity)); err != nil {
			return err
		}
	}
	out, code, err := runTool(ctx, "e2fsck", "-f", "-p", image)
	if err != nil && (code < 0 || code >= 4) { // 1 and 2: errors corrected
		return fmt.Errorf("sandbox: e2fsck %s (exit %d): %s", image, code, bytes.TrimSpace(out))
	}
	out, _, err = runTool(ctx, "resize2fs", image)
	if err != nil {
		return fmt.Errorf("sandbox: resize2fs %s: %v: %s", image, err, bytes.TrimSpace(out))
	}
	if f, err := os.OpenFile(image, os.O_RDWR, 0); err == nil {
		_ = f.Sync()
		f.Close()
	}
	return nil
}
