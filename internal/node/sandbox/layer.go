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

	"github.com/kibotos/kibotos/internal/workspace/limits"
)

// checkCapacity reports a capacity that is not whole MiB or is below
// limits.MinCapacityBytes as ErrCapacity.
func checkCapacity(c uint64) error {
	if c%limits.MiB != 0 {
		return fmt.Errorf("%w: %d bytes is not a whole number of MiB", ErrCapacity, c)
	}
	if c < limits.MinCapacityBytes {
		return fmt.Errorf("%w: %d bytes is below the minimum of %d", ErrCapacity, c, uint64(limits.MinCapacityBytes))
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
// and renamed in, cloned from the seed of its capacity (layerseed.go) or,
// failing that, made with mkfs.ext4. It returns whether it created it.
func (r *Runtime) ensureLayer(ctx context.Context, ws string, capacity uint64) (bool, error) {
	path := r.layerPath(ws)
	if _, err := os.Stat(path); err == nil {
		return false, nil
	} else if !errors.Is(err, os.ErrNotExist) {
		return false, err
	}
	release, err := r.reserveStorage(path, capacity)
	if err != nil {
		return false, err
	}
	defer release()
	_, seedErr, err := createLayerImage(ctx, r.seedDir(), path, capacity)
	if seedErr != nil {
		r.log.Warn("writable layer: seed unusable, formatted with mkfs.ext4", "workspace_id", ws,
			"capacity_bytes", capacity, "err", seedErr)
	}
	if err != nil {
		return false, err
	}
	return true, nil
}

// ext4Size reads the filesystem size from the ext4 superblock of image.
func ext4Size(image string) (uint64, error) {
	f, err := os.Open(image)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	return ext4SizeOf(f, image)
}

// ext4SizeOf reads the filesystem size from the ext4 superblock of f.
func ext4SizeOf(f *os.File, image string) (uint64, error) {
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
