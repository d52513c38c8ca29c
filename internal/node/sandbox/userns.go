package sandbox

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"
)

// User namespaces. Every execution runs in a user namespace of its own
// whose IDs 0 to IDsPerExecution-1 are the host IDs IDBase to
// IDBase+IDsPerExecution-1 of the execution's range: root in a workspace is
// an unprivileged uid on the host. Ranges are slots from Config.IDBase
// (slot n is IDBase + n×IDsPerExecution), recorded in the execution record
// (execState.IDBase) from its first write until its release, so that no two
// live executions — adopted ones included — share one.
//
// On disk, IDs stay the workspace's own: the template and the writable
// layer are mounted on the host side (fsmount, open_tree) as detached
// mounts idmapped to the execution's range (MOUNT_ATTR_IDMAP, through the
// shim's own user namespace), the overlay root is made of them by the node
// and handed to the shim as a descriptor, which moves it into place
// (move_mount). A file root makes in the workspace is uid 0 on the layer.

// IDsPerExecution is the size of an execution's ID range.
const IDsPerExecution = 65536

// DefaultIDBase is the first host ID of the first range (Config.IDBase).
const DefaultIDBase = 1_000_000_000

// allocIDs reserves the lowest free range for ws, on this Runtime and on
// the host (idclaim.go), and returns its first host ID; freeIDs releases
// it.
func (r *Runtime) allocIDs(ws string) (uint32, error) {
	r.idMu.Lock()
	defer r.idMu.Unlock()
	unlock, err := r.lockClaims()
	if err != nil {
		return 0, err
	}
	defer unlock()
	for n := 0; n < r.cfg.IDRanges; n++ {
		base := r.cfg.IDBase + uint32(n)*IDsPerExecution
		if _, used := r.idUsed[base]; used {
			continue
		}
		ok, err := r.claimIDs(base, ws)
		if err != nil {
			return 0, err
		}
		if ok {
			r.idUsed[base] = ws
			return base, nil
		}
	}
	return 0, fmt.Errorf("all %d ID ranges are in use", r.cfg.IDRanges)
}

func (r *Runtime) freeIDs(ws string, base uint32) {
	r.idMu.Lock()
	defer r.idMu.Unlock()
	if r.idUsed[base] == ws {
		delete(r.idUsed, base)
		r.unclaimIDs(base, ws)
	}
}

// loadIDs marks the ranges of every recorded execution used (New).
func (r *Runtime) loadIDs() {
	ents, _ := os.ReadDir(filepath.Join(r.root, "exec"))
	for _, e := range ents {
		name := e.Name()
		if filepath.Ext(name) != ".json" {
			continue
		}
		if st, err := r.readState(name[:len(name)-len(".json")]); err == nil && st.IDBase != 0 {
			r.idUsed[st.IDBase] = st.WorkspaceID
		}
	}
}

// idMappings is the uid and gid map of an execution whose range starts at
// base.
func idMappings(base uint32) []syscall.SysProcIDMap {
	return []syscall.SysProcIDMap{{ContainerID: 0, HostID: int(base), Size: IDsPerExecution}}
}

// mountLayer mounts the writable layer (the ext4 on loop device dev) as a
// detached mount, with its upper/ and work/ directories, for rootMount.
func mountLayer(dev string) (int, error) {
	fs, err := unix.Fsopen("ext4", unix.FSOPEN_CLOEXEC)
	if err != nil {
		return -1, fmt.Errorf("fsopen ext4: %w", err)
	}
	defer unix.Close(fs)
	if err := unix.FsconfigSetString(fs, "source", dev); err != nil {
		return -1, fmt.Errorf("mount %s: %w", dev, err)
	}
	if err := unix.FsconfigCreate(fs); err != nil {
		return -1, fmt.Errorf("mount %s: %w", dev, err)
	}
	m, err := unix.Fsmount(fs, unix.FSMOUNT_CLOEXEC, unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NODEV)
	if err != nil {
		return -1, fmt.Errorf("mount %s: %w", dev, err)
	}
	for _, d := range []string{"upper", "work"} {
		if err := unix.Mkdirat(m, d, 0o755); err != nil && err != unix.EEXIST {
			unix.Close(m)
			return -1, fmt.Errorf("mkdir %s: %w", d, err)
		}
	}
	return m, nil
}

// rootMount makes the overlay root of an execution as a detached mount:
// the template (tmpl) and the layer (the detached mount layer) idmapped
// through the user namespace usernsFD, the overlay over them mounted with
// the execution's root (host uid and gid base) as its file system IDs, so
// that what overlayfs creates itself (copy-ups, whiteouts, work files)
// maps onto the layer as 0. Its options name its layers by descriptor
// (/proc/self/fd/N): nothing in the workspace's mountinfo names a host
// path.
func rootMount(tmpl string, layer, usernsFD int, base uint32) (int, error) {
	idmap := &unix.MountAttr{Attr_set: unix.MOUNT_ATTR_IDMAP, Userns_fd: uint64(usernsFD)}
	if err := unix.MountSetattr(layer, "", unix.AT_EMPTY_PATH, idmap); err != nil {
		return -1, fmt.Errorf("idmap the writable layer: %w", err)
	}
	t, err := unix.OpenTree(unix.AT_FDCWD, tmpl, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
	if err != nil {
		return -1, fmt.Errorf("open_tree %s: %w", tmpl, err)
	}
	defer unix.Close(t)
	if err := unix.MountSetattr(t, "", unix.AT_EMPTY_PATH, idmap); err != nil {
		return -1, fmt.Errorf("idmap the template: %w", err)
	}
	var dirs [2]int
	for i, d := range []string{"upper", "work"} {
		fd, err := unix.Openat(layer, d, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return -1, fmt.Errorf("open %s: %w", d, err)
		}
		defer unix.Close(fd)
		dirs[i] = fd
	}
	type result struct {
		fd  int
		err error
	}
	c := make(chan result, 1)
	// On a thread of its own, which ends with the goroutine: overlayfs
	// keeps the credentials of its mounter, and these are root's with
	// the execution's IDs as file system IDs.
	go func() {
		runtime.LockOSThread()
		fd, err := mountOverlayAs(base, fdPath(t), fdPath(dirs[0]), fdPath(dirs[1]))
		c <- result{fd, err}
	}()
	res := <-c
	return res.fd, res.err
}

func fdPath(fd int) string { return "/proc/self/fd/" + strconv.Itoa(fd) }

// mountOverlayAs runs on a locked thread that is never given back.
func mountOverlayAs(base uint32, lower, upper, work string) (int, error) {
	if _, _, e := unix.RawSyscall(unix.SYS_SETFSGID, uintptr(base), 0, 0); e != 0 {
		return -1, e
	}
	if _, _, e := unix.RawSyscall(unix.SYS_SETFSUID, uintptr(base), 0, 0); e != 0 {
		return -1, e
	}
	// setfsuid away from 0 clears the file system capabilities from the
	// effective set; the permitted set still has them.
	if err := raiseEffective(); err != nil {
		return -1, err
	}
	fs, err := unix.Fsopen("overlay", unix.FSOPEN_CLOEXEC)
	if err != nil {
		return -1, fmt.Errorf("fsopen overlay: %w", err)
	}
	defer unix.Close(fs)
	for _, kv := range [][2]string{{"lowerdir", lower}, {"upperdir", upper}, {"workdir", work}, {"index", "off"}} {
		if err := unix.FsconfigSetString(fs, kv[0], kv[1]); err != nil {
			return -1, fmt.Errorf("overlay %s: %w", kv[0], err)
		}
	}
	if err := unix.FsconfigCreate(fs); err != nil {
		return -1, fmt.Errorf("mount overlay: %w", err)
	}
	m, err := unix.Fsmount(fs, unix.FSMOUNT_CLOEXEC, unix.MOUNT_ATTR_NODEV)
	if err != nil {
		return -1, fmt.Errorf("mount overlay: %w", err)
	}
	return m, nil
}

// startCmd starts cmd. A command that makes a user namespace with an ID
// map (the init shim) is started from a thread whose effective uid is the
// map's first host ID (capabilities kept), and the thread is root again
// right after: the new user namespace is then owned by the execution's
// host uid and not by root. The kernel charges per-user limits (inotify
// instances and watches, user namespaces, …) to the owner of a user
// namespace at every level above it, so an execution's are its own, not
// host root's. Every start of the shim goes through here (cgroups'
// startIn too).
func startCmd(cmd *exec.Cmd) error {
	a := cmd.SysProcAttr
	if a == nil || a.Cloneflags&unix.CLONE_NEWUSER == 0 || len(a.UidMappings) == 0 || a.UidMappings[0].HostID == 0 {
		return cmd.Start()
	}
	runtime.LockOSThread()
	if err := setThreadEUID(uint32(a.UidMappings[0].HostID)); err != nil {
		// Whatever state the thread is in, it ends with its goroutine.
		return fmt.Errorf("effective uid %d: %w", a.UidMappings[0].HostID, err)
	}
	err := cmd.Start()
	// Back to 0 from a nonzero euid: the kernel restores the effective
	// capabilities from the permitted ones.
	if _, _, e := unix.RawSyscall(unix.SYS_SETRESUID, ^uintptr(0), 0, ^uintptr(0)); e != 0 {
		return errors.Join(err, fmt.Errorf("effective uid back to 0: %w", e))
	}
	runtime.UnlockOSThread()
	return err
}

// setThreadEUID sets the effective uid of this thread only (the raw system
// call, not Go's, which changes every thread) and restores the effective
// capabilities that the change clears.
func setThreadEUID(uid uint32) error {
	if _, _, e := unix.RawSyscall(unix.SYS_SETRESUID, ^uintptr(0), uintptr(uid), ^uintptr(0)); e != 0 {
		return e
	}
	return raiseEffective()
}

// raiseEffective makes this thread's effective capabilities its permitted
// ones.
func raiseEffective() error {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return err
	}
	data[0].Effective, data[1].Effective = data[0].Permitted, data[1].Permitted
	if err := unix.Capset(&hdr, &data[0]); err != nil {
		return fmt.Errorf("capset: %w", err)
	}
	return nil
}

// MountIdmappedRoot makes an execution's root the way Start does (for the
// benchmark's crun reference): the ext4 on loop device dev and the template
// tmpl, idmapped through the user namespace usernsFD (a range from base),
// and the overlay of them, returned as a detached mount to move_mount
// somewhere.
func MountIdmappedRoot(tmpl, dev string, usernsFD int, base uint32) (int, error) {
	layer, err := mountLayer(dev)
	if err != nil {
		return -1, err
	}
	defer unix.Close(layer)
	return rootMount(tmpl, layer, usernsFD, base)
}
