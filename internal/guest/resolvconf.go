package guest

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"
)

// ResolvConf is the workspace's /etc/resolv.conf: the node's DNS server
// inside the workspace's link (internal/node/network's DNSAddr). It is DNS
// configuration version 1 (internal/nodewire.DNSConfigVersion), which the
// node records for every execution it starts.
const ResolvConf = "nameserver 169.254.77.1\n"

// writeResolvConf replaces root/etc/resolv.conf with ResolvConf at boot,
// whatever the writable layer holds there (a file, a symbolic link, nothing
// yet): a temporary file in etc, created exclusively without following
// links, renamed over it. etc is created when missing; an etc that is not a
// directory (a symbolic link included) is an error and left alone.
func writeResolvConf(root string) error {
	etc := filepath.Join(root, "etc")
	if err := os.Mkdir(etc, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
		return err
	}
	dir, err := unix.Open(etc, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("%s: %w", etc, err)
	}
	defer unix.Close(dir)
	tmp := ".resolv.conf.kibotos-" + strconv.Itoa(os.Getpid())
	_ = unix.Unlinkat(dir, tmp, 0) // a leftover of a crashed boot
	fd, err := unix.Openat(dir, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o644)
	if err != nil {
		return fmt.Errorf("%s/%s: %w", etc, tmp, err)
	}
	f := os.NewFile(uintptr(fd), tmp)
	_, werr := f.WriteString(ResolvConf)
	if werr == nil {
		werr = f.Chmod(0o644) // whatever the umask
	}
	if cerr := f.Close(); werr == nil {
		werr = cerr
	}
	if werr == nil {
		werr = unix.Renameat(dir, tmp, dir, "resolv.conf")
	}
	if werr != nil {
		_ = unix.Unlinkat(dir, tmp, 0)
		return fmt.Errorf("%s/resolv.conf: %w", etc, werr)
	}
	return nil
}
