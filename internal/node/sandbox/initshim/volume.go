package initshim

import (
	"errors"
	"fmt"
	"strings"

	"golang.org/x/sys/unix"
)

// mountVolume moves the Volume's detached mount (fd, idmapped by the node)
// onto mountPath inside root, once the shim's own mounts are made and
// before the pivot.
//
// The path is resolved inside the root only, one component at a time from
// a descriptor of the root: each component is made when missing (mkdirat,
// 0755, owned by root of the workspace) and opened with openat2
// (RESOLVE_BENEATH, RESOLVE_NO_SYMLINKS, RESOLVE_NO_MAGICLINKS, O_NOFOLLOW,
// O_DIRECTORY). The writable layer is the workspace's: a symbolic link on
// the path (to /, /proc, ../../.., anywhere) is refused, never followed, so
// the mount cannot land outside the root, nor on another of the
// workspace's own mounts through a link. The mount is then moved onto the
// descriptor of the last directory (move_mount with
// MOVE_MOUNT_T_EMPTY_PATH): no path is resolved again in between. Nothing
// else runs in the execution yet that could change the path meanwhile.
func mountVolume(root, mountPath string, fd int) error {
	defer unix.Close(fd)
	fail := func(format string, a ...any) error {
		return fmt.Errorf("init: the Volume's mount path %s in the workspace: %s", mountPath, fmt.Sprintf(format, a...))
	}
	dir, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fail("open the root: %v", err)
	}
	defer func() { unix.Close(dir) }()
	if !strings.HasPrefix(mountPath, "/") {
		return fail("not absolute")
	}
	walked := ""
	for _, c := range strings.Split(mountPath[1:], "/") {
		if c == "" || c == "." || c == ".." || strings.ContainsRune(c, 0) {
			return fail("not a clean path")
		}
		walked += "/" + c
		next, err := openBeneath(dir, c)
		if errors.Is(err, unix.ENOENT) {
			if err := unix.Mkdirat(dir, c, 0o755); err != nil && !errors.Is(err, unix.EEXIST) {
				return fail("mkdir %s: %v", walked, err)
			}
			next, err = openBeneath(dir, c)
		}
		if err != nil {
			var st unix.Stat_t
			if serr := unix.Fstatat(dir, c, &st, unix.AT_SYMLINK_NOFOLLOW); serr == nil && st.Mode&unix.S_IFMT == unix.S_IFLNK {
				return fail("%s is a symbolic link; the workspace cannot start with this Volume until it is a directory", walked)
			}
			if errors.Is(err, unix.ENOTDIR) {
				return fail("%s is not a directory; the workspace cannot start with this Volume until it is one", walked)
			}
			return fail("open %s: %v", walked, err)
		}
		unix.Close(dir)
		dir = next
		var st unix.Stat_t
		if err := unix.Fstat(dir, &st); err != nil {
			return fail("stat %s: %v", walked, err)
		}
		if st.Mode&unix.S_IFMT != unix.S_IFDIR {
			return fail("%s is not a directory; the workspace cannot start with this Volume until it is one", walked)
		}
	}
	if err := unix.MoveMount(fd, "", dir, "", unix.MOVE_MOUNT_F_EMPTY_PATH|unix.MOVE_MOUNT_T_EMPTY_PATH); err != nil {
		return fail("move the Volume into place: %v", err)
	}
	return nil
}

// openBeneath opens the directory name right under dir, following no
// symbolic link and leaving dir by no "..".
func openBeneath(dir int, name string) (int, error) {
	return unix.Openat2(dir, name, &unix.OpenHow{
		Flags:   unix.O_PATH | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
	})
}
