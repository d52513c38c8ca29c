package sandbox

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Loop devices are attached with ioctls, not losetup: LOOP_CTL_GET_FREE on
// /dev/loop-control, then LOOP_CONFIGURE (Linux 5.8+; LOOP_SET_FD plus
// LOOP_SET_STATUS64 on older kernels) with LO_FLAGS_AUTOCLEAR. Autoclear
// makes the kernel detach the device when its last user goes: the runtime
// hands the open device to the init shim, the shim mounts it inside the
// execution's private mount namespace and closes it, so the mount is the only
// user. When the execution's last process exits, the namespace and its
// mounts go, and the loop device detaches itself: nothing is left attached if
// the node agent dies at any point.

// attachLoop attaches image to a free loop device. The returned file keeps
// the device attached until it is closed (or a mount takes over).
func attachLoop(image string) (*os.File, string, error) {
	ctl, err := os.OpenFile("/dev/loop-control", os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, "", fmt.Errorf("loop: %w", err)
	}
	defer ctl.Close()
	back, err := os.OpenFile(image, os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, "", fmt.Errorf("loop: %w", err)
	}
	defer back.Close()
	var lastErr error
	for attempt := 0; attempt < 50; attempt++ {
		n, err := unix.IoctlRetInt(int(ctl.Fd()), unix.LOOP_CTL_GET_FREE)
		if err != nil {
			return nil, "", fmt.Errorf("loop: LOOP_CTL_GET_FREE: %w", err)
		}
		dev := fmt.Sprintf("/dev/loop%d", n)
		f, err := openLoopDevice(dev, n)
		if err != nil {
			return nil, "", err
		}
		err = configureLoop(f, back, image)
		if err == nil {
			return f, dev, nil
		}
		f.Close()
		lastErr = err
		if errors.Is(err, unix.EBUSY) {
			// Another process took it between GET_FREE and CONFIGURE.
			time.Sleep(time.Duration(attempt+1) * time.Millisecond)
			continue
		}
		return nil, "", err
	}
	return nil, "", fmt.Errorf("loop: no free device: %w", lastErr)
}

func openLoopDevice(dev string, n int) (*os.File, error) {
	for i := 0; ; i++ {
		f, err := os.OpenFile(dev, os.O_RDWR|unix.O_CLOEXEC, 0)
		if err == nil {
			return f, nil
		}
		if !errors.Is(err, os.ErrNotExist) || i >= 20 {
			return nil, fmt.Errorf("loop: %w", err)
		}
		if i == 10 { // devtmpfs should have made it; make it ourselves
			_ = unix.Mknod(dev, unix.S_IFBLK|0o660, int(unix.Mkdev(7, uint32(n))))
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func configureLoop(dev, back *os.File, image string) error {
	var cfg unix.LoopConfig
	cfg.Fd = uint32(back.Fd())
	cfg.Info.Flags = unix.LO_FLAGS_AUTOCLEAR
	copy(cfg.Info.File_name[:len(cfg.Info.File_name)-1], image)
	err := unix.IoctlLoopConfigure(int(dev.Fd()), &cfg)
	if err == nil {
		return nil
	}
	if !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOTTY) {
		return fmt.Errorf("loop: LOOP_CONFIGURE %s: %w", dev.Name(), err)
	}
	// Kernels before 5.8.
	if err := unix.IoctlSetInt(int(dev.Fd()), unix.LOOP_SET_FD, int(back.Fd())); err != nil {
		return fmt.Errorf("loop: LOOP_SET_FD %s: %w", dev.Name(), err)
	}
	if err := unix.IoctlLoopSetStatus64(int(dev.Fd()), &cfg.Info); err != nil {
		_ = unix.IoctlSetInt(int(dev.Fd()), unix.LOOP_CLR_FD, 0)
		return fmt.Errorf("loop: LOOP_SET_STATUS64 %s: %w", dev.Name(), err)
	}
	return nil
}

// loopDevice is an attached loop device and its backing file.
type loopDevice struct {
	Dev     string // /dev/loopN
	Backing string // path of the backing file (without " (deleted)")
	Deleted bool
}

// attachedLoops lists loop devices whose backing file is path (exact) or,
// with prefix, lies under path.
func attachedLoops(path string, prefix bool) ([]loopDevice, error) {
	ents, err := os.ReadDir("/sys/block")
	if err != nil {
		return nil, err
	}
	var out []loopDevice
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), "loop") {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/sys/block", e.Name(), "loop", "backing_file"))
		if err != nil {
			continue // not attached
		}
		back := strings.TrimSuffix(string(b), "\n")
		deleted := false
		if s, ok := strings.CutSuffix(back, " (deleted)"); ok {
			back, deleted = s, true
		}
		match := back == path
		if prefix {
			match = back == path || strings.HasPrefix(back, strings.TrimSuffix(path, "/")+"/")
		}
		if match {
			out = append(out, loopDevice{Dev: "/dev/" + e.Name(), Backing: back, Deleted: deleted})
		}
	}
	return out, nil
}

// detachLoop asks the kernel to detach dev. On a device still in use the
// kernel only sets autoclear, so it detaches when its last user goes.
func detachLoop(dev string) error {
	f, err := os.OpenFile(dev, os.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return err
	}
	defer f.Close()
	err = unix.IoctlSetInt(int(f.Fd()), unix.LOOP_CLR_FD, 0)
	if err != nil && !errors.Is(err, unix.ENXIO) {
		return fmt.Errorf("loop: LOOP_CLR_FD %s: %w", dev, err)
	}
	return nil
}

// waitLoopsDetached waits until no loop device is backed by image, asking
// the kernel to detach leftovers on the way.
func waitLoopsDetached(image string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	asked := map[string]bool{}
	for {
		loops, err := attachedLoops(image, false)
		if err != nil {
			return err
		}
		if len(loops) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			var devs []string
			for _, l := range loops {
				devs = append(devs, l.Dev)
			}
			return fmt.Errorf("%w: %s still attached to %s", ErrRelease, image, strings.Join(devs, ", "))
		}
		for _, l := range loops {
			if !asked[l.Dev] && time.Until(deadline) < timeout/2 {
				asked[l.Dev] = true
				_ = detachLoop(l.Dev)
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
}
