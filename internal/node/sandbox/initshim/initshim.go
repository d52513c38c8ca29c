// Package initshim is the sandbox runtime's init shim: the process that
// starts as PID 1 in an execution's new namespaces, sets up its mounts and
// root, and execs kibotos-guest. It is small on purpose (the standard
// library, x/sys/unix, the guest protocol and the seccomp filter only) so
// that kibotos-guest itself can be the shim: the runtime then starts a
// binary of a few MB instead of re-executing the whole node. Any binary whose main calls
// MaybeRun first (kibotos-guest, and through sandbox.MaybeRunInit the
// binaries that embed the runtime) can serve as the shim.
package initshim

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/kibotos/kibotos/internal/guest/protocol"
	"github.com/kibotos/kibotos/internal/node/sandbox/seccomp"
)

// Arg0 is argv[0] of the init shim: the runtime executes its init binary
// (by default kibotos-guest) under this name inside the new namespaces.
const Arg0 = "kibotos-sandbox-init"

// File descriptors the runtime hands to the init shim. The first three
// are PID 1's for good (package protocol); the shim closes every other
// descriptor, however it was inherited, at its exec of the guest.
const (
	// ChannelFD is the guest's end of the node's channel.
	ChannelFD = protocol.ChannelFD
	// NodeChannelFD is the node's end of the channel, kept by PID 1 for
	// a node that restarts.
	NodeChannelFD = protocol.NodeChannelFD
	// LogReadFD is the read end of the log pipe (PID 1's stdout and
	// stderr), kept by PID 1 for the same reason.
	LogReadFD = protocol.LogReadFD
	// ConfigFD is a SOCK_SEQPACKET socket: one message, the Config JSON
	// with the overlay root (a detached mount, idmapped layers) attached,
	// and the Volume's detached mount (idmapped) after it when the
	// configuration has a VolumePath; end of file without one when the node
	// gave up.
	ConfigFD = 6
	// StatusFD is the write end of a pipe: an error message, or EOF at
	// the exec of the guest.
	StatusFD = 7
	// Descriptor 8 is unused.
	// GuestFD is the node's sealed, in-memory copy of kibotos-guest
	// (a memfd), which the shim execs as PID 1: nothing of the host's
	// filesystem is mounted for it, so no host path shows in the
	// workspace's mountinfo.
	GuestFD = 9
)

// Config is what the runtime tells the init shim (JSON on ConfigFD).
type Config struct {
	WorkspaceID   string `json:"workspace_id"`
	CgroupVersion int    `json:"cgroup_version"`
	// TmpfsBytes sizes /tmp and /dev/shm.
	TmpfsBytes uint64 `json:"tmpfs_bytes"`
	// UserLimits are written to /proc/sys/user/<name> of the execution's
	// user namespace (per-namespace kernel limits such as
	// max_inotify_instances) before the capabilities go.
	UserLimits map[string]uint64 `json:"user_limits,omitempty"`
	// VolumePath is where the Volume is mounted inside the root (an
	// absolute, clean path the node validated); its detached mount comes
	// with the configuration, after the root's. Empty: no Volume.
	VolumePath string `json:"volume_path,omitempty"`
}

// MaybeRun runs the sandbox init shim and never returns when this process
// is one (argv[0] is Arg0); otherwise it returns false at once. Every binary
// that may serve as the shim (kibotos-guest, and the binaries that embed
// the runtime through sandbox.MaybeRunInit) must call it first thing in
// main.
//
// The shim starts as PID 1 of a new user namespace (its ID maps written
// by the node) and new mount, PID, UTS, IPC and network namespaces that it
// owns (clone flags set by the node), in the execution's cgroup (born
// there, or placed there by the node before it sends the configuration),
// and waits for its configuration. It then enters a new cgroup namespace,
// moves the overlay root the node made (a descriptor sent with the
// configuration) into place, mounts /proc (sensitive files masked,
// host-wide knobs read-only), /sys (read-only, firmware and block devices
// masked), a minimal /dev (the host's devices bound), /tmp and /run, moves
// the Volume (a second descriptor, when configured) onto its mount path
// (volume.go), sets the hostname, brings up lo, pivots into the new root, sets the
// per-user-namespace limits (Config.UserLimits), installs the system call filter, sets no_new_privs,
// drops capabilities from the bounding set and execs kibotos-guest, which
// stays PID 1, with descriptors 0 to 2 and the three of the channel
// (ChannelFD, NodeChannelFD, LogReadFD) only.
func MaybeRun() bool {
	if len(os.Args) == 0 || os.Args[0] != Arg0 {
		return false
	}
	// Namespace and mount work below must stay on one thread: the cgroup
	// namespace is per thread until exec.
	runtime.LockOSThread()
	err := runInit()
	status := os.NewFile(StatusFD, "status")
	if status != nil {
		fmt.Fprintf(status, "%v", err)
	}
	os.Exit(1)
	return true
}

func runInit() error {
	// Nothing of the host's is to be reached through this process while
	// it sets up (ptrace, /proc/<pid>/fd); the guest sets the same again
	// after its exec, which resets it.
	_ = unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0)
	// Whatever the node inherited and left open (a descriptor without
	// close-on-exec) ends at the exec of the guest; so do the shim's own
	// (ConfigFD and up). The channel's three stay (keepFDs).
	if err := closeOnExecFrom(GuestFD + 1); err != nil {
		return err
	}
	unix.Umask(0)
	unix.CloseOnExec(StatusFD)
	cfg, rootFD, volFD, err := readConfig()
	if err != nil {
		return err
	}
	// The node has put this process into the execution's cgroup: a cgroup
	// namespace made now has that cgroup as its root.
	if err := unix.Unshare(unix.CLONE_NEWCGROUP); err != nil {
		return fmt.Errorf("init: unshare cgroup namespace: %w", err)
	}
	root, err := attachRoot(rootFD)
	if err != nil {
		return err
	}
	if err := setupRoot(&cfg, root); err != nil {
		return err
	}
	if volFD >= 0 {
		if err := mountVolume(root, cfg.VolumePath, volFD); err != nil {
			return err
		}
	}
	if err := unix.Sethostname([]byte(cfg.WorkspaceID)); err != nil {
		return fmt.Errorf("init: sethostname: %w", err)
	}
	if err := loopbackUp(); err != nil {
		return fmt.Errorf("init: lo up: %w", err)
	}
	if err := pivot(root); err != nil {
		return err
	}
	setUserLimits(cfg.UserLimits)
	// Stdin was the host's /dev/null; the workspace's own replaces it.
	if err := stdinDevNull(); err != nil {
		return err
	}
	// The system call filter goes on while this process still holds
	// CAP_SYS_ADMIN, and stays across the exec of the guest and in
	// everything it starts; so does no_new_privs: no setuid or file
	// capability gains anything in the workspace.
	if err := seccomp.Install(); err != nil {
		return fmt.Errorf("init: %w", err)
	}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("init: no_new_privs: %w", err)
	}
	if err := dropCapabilities(); err != nil {
		return err
	}
	if err := keepFDs(); err != nil {
		return err
	}
	env := []string{
		"PATH=" + workspacePath,
		"HOME=/root",
		"TERM=dumb",
		"container=kibotos",
		"KIBOTOS_WORKSPACE_ID=" + cfg.WorkspaceID,
		protocol.ChannelFDEnv + "=" + strconv.Itoa(ChannelFD),
	}
	// The memfd itself (execveat with AT_EMPTY_PATH): PID 1's /proc/1/fd
	// is masked by now.
	err = execFD(GuestFD, []string{"kibotos-guest"}, env)
	return fmt.Errorf("init: exec kibotos-guest: %w", err)
}

// execFD executes the program open at fd (execveat(2) with AT_EMPTY_PATH,
// as fexecve(3) does), without a path through /proc.
func execFD(fd int, argv, env []string) error {
	empty, err := unix.BytePtrFromString("")
	if err != nil {
		return err
	}
	argvp, err := cStrings(argv)
	if err != nil {
		return err
	}
	envp, err := cStrings(env)
	if err != nil {
		return err
	}
	_, _, errno := unix.Syscall6(unix.SYS_EXECVEAT, uintptr(fd), uintptr(unsafe.Pointer(empty)),
		uintptr(unsafe.Pointer(&argvp[0])), uintptr(unsafe.Pointer(&envp[0])), unix.AT_EMPTY_PATH, 0)
	return errno
}

// cStrings is ss as a NULL-terminated array of C strings.
func cStrings(ss []string) ([]*byte, error) {
	out := make([]*byte, len(ss)+1)
	for i, s := range ss {
		p, err := unix.BytePtrFromString(s)
		if err != nil {
			return nil, err
		}
		out[i] = p
	}
	return out, nil
}

// closeOnExecFrom marks every descriptor from first up close-on-exec
// (close_range(2) with CLOSE_RANGE_CLOEXEC; on kernels before 5.11, one by
// one up to the descriptor limit: PID 1's /proc/1/fd is masked).
func closeOnExecFrom(first int) error {
	err := unix.CloseRange(uint(first), ^uint(0), unix.CLOSE_RANGE_CLOEXEC)
	if err == nil {
		return nil
	}
	var lim unix.Rlimit
	if rerr := unix.Getrlimit(unix.RLIMIT_NOFILE, &lim); rerr != nil {
		return fmt.Errorf("init: close inherited descriptors: %v; %v", err, rerr)
	}
	for fd := first; uint64(fd) < lim.Cur; fd++ {
		unix.CloseOnExec(fd)
	}
	return nil
}

// keepFDs leaves PID 1 exactly 0 to 2 and the channel's three: those
// inherited, and nothing else, across the exec.
func keepFDs() error {
	for _, fd := range []int{ChannelFD, NodeChannelFD, LogReadFD} {
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_SETFD, 0); err != nil {
			return fmt.Errorf("init: descriptor %d: %w", fd, err)
		}
	}
	return closeOnExecFrom(ConfigFD)
}

// stdinDevNull makes descriptor 0 the workspace's /dev/null.
func stdinDevNull() error {
	fd, err := unix.Open("/dev/null", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("init: /dev/null: %w", err)
	}
	defer unix.Close(fd)
	if err := unix.Dup3(fd, 0, 0); err != nil {
		return fmt.Errorf("init: stdin: %w", err)
	}
	return nil
}

// workspacePath is the PATH of the guest agent.
const workspacePath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

func mount(source, target, fstype string, flags uintptr, data string) error {
	if err := unix.Mount(source, target, fstype, flags, data); err != nil {
		return fmt.Errorf("init: mount %s on %s (%s): %w", source, target, fstype, err)
	}
	return nil
}

// mountPoint makes sure root/name is a real directory, not a symlink that
// would take a mount somewhere else: the writable layer is the user's.
func mountPoint(root, name string, mode os.FileMode) (string, error) {
	p := filepath.Join(root, name)
	fi, err := os.Lstat(p)
	switch {
	case errors.Is(err, os.ErrNotExist):
		if err := os.Mkdir(p, mode); err != nil {
			return "", fmt.Errorf("init: %w", err)
		}
		return p, nil
	case err != nil:
		return "", fmt.Errorf("init: %w", err)
	case !fi.IsDir():
		return "", fmt.Errorf("init: /%s in the workspace is not a directory (%s); the workspace cannot start until it is one", name, fi.Mode().Type())
	}
	return p, nil
}

// readConfig reads the configuration, the overlay root's descriptor and,
// when the configuration has a VolumePath, the Volume's (otherwise -1).
func readConfig() (Config, int, int, error) {
	var cfg Config
	b := make([]byte, 1<<20)
	oob := make([]byte, unix.CmsgSpace(2*4))
	n, oobn, _, _, err := unix.Recvmsg(ConfigFD, b, oob, unix.MSG_CMSG_CLOEXEC)
	unix.Close(ConfigFD)
	if err != nil {
		return cfg, -1, -1, fmt.Errorf("init: read configuration: %w", err)
	}
	if n == 0 {
		return cfg, -1, -1, errors.New("init: the node went away before configuring the execution")
	}
	var fds []int
	if msgs, err := unix.ParseSocketControlMessage(oob[:oobn]); err == nil && len(msgs) == 1 {
		fds, _ = unix.ParseUnixRights(&msgs[0])
	}
	if len(fds) == 0 {
		return cfg, -1, -1, errors.New("init: the configuration came without the root")
	}
	if err := json.Unmarshal(b[:n], &cfg); err != nil {
		return cfg, -1, -1, fmt.Errorf("init: configuration: %w", err)
	}
	want := 1
	if cfg.VolumePath != "" {
		want = 2
	}
	if len(fds) != want {
		return cfg, -1, -1, fmt.Errorf("init: the configuration came with %d descriptors, not %d", len(fds), want)
	}
	vol := -1
	if want == 2 {
		vol = fds[1]
	}
	return cfg, fds[0], vol, nil
}

// attachRoot attaches the overlay root (the detached mount fd) in this
// mount namespace, which is a copy of the host's where this process, the
// root of a user namespace of its own, can search few directories: on a
// private tmpfs over the copy's /tmp (or /mnt), gone with the pivot.
func attachRoot(fd int) (string, error) {
	if err := mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return "", err
	}
	scratch := "/tmp"
	if fi, err := os.Stat(scratch); err != nil || !fi.IsDir() {
		scratch = "/mnt"
	}
	if err := mount("tmpfs", scratch, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "mode=700,size=64k"); err != nil {
		return "", err
	}
	root := filepath.Join(scratch, "root")
	if err := os.Mkdir(root, 0o700); err != nil {
		return "", fmt.Errorf("init: %w", err)
	}
	if err := unix.MoveMount(fd, "", unix.AT_FDCWD, root, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return "", fmt.Errorf("init: move the root into place: %w", err)
	}
	unix.Close(fd)
	return root, nil
}

// setUserLimits writes the per-user-namespace limits (best effort: a
// kernel without one of them only lacks that limit).
func setUserLimits(m map[string]uint64) {
	for name, v := range m {
		if strings.ContainsAny(name, "/.") {
			continue
		}
		_ = os.WriteFile("/proc/sys/user/"+name, []byte(strconv.FormatUint(v, 10)), 0)
	}
}

func setupRoot(cfg *Config, root string) error {
	const nosuidNodevNoexec = unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC

	// /proc, with the host-wide knobs read-only and the sensitive files masked.
	proc, err := mountPoint(root, "proc", 0o555)
	if err != nil {
		return err
	}
	if err := mount("proc", proc, "proc", nosuidNodevNoexec, ""); err != nil {
		return err
	}
	// /sys read-only, the cgroup of the execution visible (read-only) at
	// /sys/fs/cgroup through the cgroup namespace.
	sys, err := mountPoint(root, "sys", 0o555)
	if err != nil {
		return err
	}
	if err := mount("sysfs", sys, "sysfs", nosuidNodevNoexec|unix.MS_RDONLY, ""); err != nil {
		return err
	}
	mountCgroupFS(filepath.Join(sys, "fs/cgroup"), cfg.CgroupVersion)
	if err := mask(sys, maskedSys); err != nil {
		return err
	}

	// /dev: a small tmpfs with the usual character devices and devpts.
	dev, err := mountPoint(root, "dev", 0o755)
	if err != nil {
		return err
	}
	if err := mount("tmpfs", dev, "tmpfs", unix.MS_NOSUID|unix.MS_NOEXEC, "mode=755,size=1m,nr_inodes=4096"); err != nil {
		return err
	}
	// Devices cannot be made in a user namespace: the host's are bound
	// (the execution's device list allows these only).
	for _, d := range []string{"null", "zero", "full", "random", "urandom", "tty"} {
		t := filepath.Join(dev, d)
		if err := os.WriteFile(t, nil, 0o666); err != nil {
			return fmt.Errorf("init: %w", err)
		}
		if err := mount("/dev/"+d, t, "", unix.MS_BIND, ""); err != nil {
			return err
		}
	}
	for _, l := range [][2]string{{"/proc/self/fd", "fd"}, {"/proc/self/fd/0", "stdin"}, {"/proc/self/fd/1", "stdout"}, {"/proc/self/fd/2", "stderr"}, {"pts/ptmx", "ptmx"}} {
		if err := os.Symlink(l[0], filepath.Join(dev, l[1])); err != nil {
			return fmt.Errorf("init: %w", err)
		}
	}
	if err := os.Mkdir(filepath.Join(dev, "pts"), 0o755); err != nil {
		return fmt.Errorf("init: %w", err)
	}
	if err := mount("devpts", filepath.Join(dev, "pts"), "devpts", unix.MS_NOSUID|unix.MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620"); err != nil {
		return err
	}
	if err := os.Mkdir(filepath.Join(dev, "shm"), os.ModeSticky|0o777); err != nil {
		return fmt.Errorf("init: %w", err)
	}
	tmpfsSize := strconv.FormatUint(cfg.TmpfsBytes, 10)
	if err := mount("shm", filepath.Join(dev, "shm"), "tmpfs", nosuidNodevNoexec, "mode=1777,size="+tmpfsSize); err != nil {
		return err
	}
	if err := hardenProc(proc, dev); err != nil {
		return err
	}

	// /tmp: tmpfs (charged to the execution's memory).
	tmp, err := mountPoint(root, "tmp", os.ModeSticky|0o777)
	if err != nil {
		return err
	}
	if err := mount("tmpfs", tmp, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=1777,size="+tmpfsSize); err != nil {
		return err
	}

	// /run: a small tmpfs of the workspace's own (the runtime puts
	// nothing there).
	run, err := mountPoint(root, "run", 0o755)
	if err != nil {
		return err
	}
	if err := mount("tmpfs", run, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=755,size=16m"); err != nil {
		return err
	}
	return nil
}

// mountCgroupFS shows the execution's own cgroup (the cgroup namespace's
// root) read-only, so that the guest can measure memory pressure. Failure
// only costs that measurement.
func mountCgroupFS(target string, version int) {
	const flags = unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC | unix.MS_RDONLY
	if version == 2 {
		_ = unix.Mount("cgroup2", target, "cgroup2", flags, "")
		return
	}
	if err := unix.Mount("tmpfs", target, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "mode=755,size=64k"); err != nil {
		return
	}
	mem := filepath.Join(target, "memory")
	if err := os.Mkdir(mem, 0o555); err == nil {
		_ = unix.Mount("cgroup", mem, "cgroup", flags, "memory")
	}
	_ = unix.Mount("", target, "", unix.MS_REMOUNT|flags, "mode=755,size=64k")
}

// Masked and read-only paths: the OCI runtime's defaults (as runc and
// containerd apply them), and the /proc files that show the host's kernel
// memory (kpage*, slabinfo, vmallocinfo, kallsyms). A masked file reads
// empty (/dev/null over it), a masked directory is an empty read-only
// tmpfs; a missing path is skipped.
var (
	maskedProc = []string{
		"acpi", "asound", "interrupts", "kcore", "keys", "latency_stats",
		"timer_list", "timer_stats", "sched_debug", "scsi", "kallsyms",
		"kpageflags", "kpagecount", "kpagecgroup", "slabinfo", "vmallocinfo",
	}
	// PID 1's (the guest's) descriptors: not dumpable, it still shows
	// their numbers to root of the workspace (the kernel makes its /proc
	// files owned by root of its user namespace); masked, nothing of them
	// shows. /proc/1 is this shim, PID 1, which becomes the guest.
	maskedPID1   = []string{"1/fd", "1/fdinfo", "1/map_files"}
	readOnlyProc = []string{"bus", "fs", "irq", "sys", "sysrq-trigger"}
	// block and devices/virtual/block show the host's block devices,
	// loop devices with their backing files' host paths among them.
	maskedSys = []string{"firmware", "devices/virtual/powercap", "block", "devices/virtual/block"}
)

// hardenProc makes the host-wide parts of /proc read-only and masks files
// that expose the host's kernel.
func hardenProc(proc, dev string) error {
	const ro = unix.MS_BIND | unix.MS_REMOUNT | unix.MS_RDONLY | unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC
	for _, p := range readOnlyProc {
		t := filepath.Join(proc, p)
		if _, err := os.Lstat(t); err != nil {
			continue
		}
		if err := mount(t, t, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return err
		}
		if err := mount("", t, "", ro, ""); err != nil {
			return err
		}
	}
	if err := maskWith(proc, maskedPID1, ""); err != nil {
		return err
	}
	return maskWith(proc, maskedProc, filepath.Join(dev, "null"))
}

// mask masks the paths under dir (whose /dev is not at hand: no file of
// sysfs is masked, only directories).
func mask(dir string, paths []string) error { return maskWith(dir, paths, "") }

func maskWith(dir string, paths []string, null string) error {
	const flags = unix.MS_RDONLY | unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC
	for _, p := range paths {
		t := filepath.Join(dir, p)
		fi, err := os.Lstat(t)
		switch {
		case err != nil:
			continue
		case fi.IsDir():
			if err := mount("tmpfs", t, "tmpfs", flags, "mode=555,size=4k"); err != nil {
				return err
			}
		case null != "":
			if err := mount(null, t, "", unix.MS_BIND, ""); err != nil {
				return err
			}
		}
	}
	return nil
}

// loopbackUp brings up lo, the only interface of the new network namespace.
func loopbackUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return err
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	return unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr)
}

// pivot makes root the root of the mount namespace and detaches the old
// one (pivot_root(".", ".") stacks the old root on the new one).
func pivot(root string) error {
	if err := unix.Chdir(root); err != nil {
		return fmt.Errorf("init: chdir %s: %w", root, err)
	}
	if err := unix.PivotRoot(".", "."); err != nil {
		return fmt.Errorf("init: pivot_root: %w", err)
	}
	if err := unix.Unmount(".", unix.MNT_DETACH); err != nil {
		return fmt.Errorf("init: detach old root: %w", err)
	}
	if err := unix.Chdir("/"); err != nil {
		return fmt.Errorf("init: chdir /: %w", err)
	}
	return nil
}

// keptCapabilities is what processes of a workspace may have, in the
// execution's user namespace (the set container runtimes grant by
// default, without CAP_MKNOD, which the device list and the user namespace
// make useless, and without CAP_NET_RAW: the system call filter refuses
// raw and packet sockets): no mounts, no raw devices, no module loading,
// no ptrace, no open_by_handle_at.
var keptCapabilities = map[int]bool{
	unix.CAP_CHOWN: true, unix.CAP_DAC_OVERRIDE: true, unix.CAP_FOWNER: true,
	unix.CAP_FSETID: true, unix.CAP_KILL: true, unix.CAP_SETGID: true,
	unix.CAP_SETUID: true, unix.CAP_SETPCAP: true, unix.CAP_NET_BIND_SERVICE: true,
	unix.CAP_SYS_CHROOT: true, unix.CAP_AUDIT_WRITE: true,
	unix.CAP_SETFCAP: true,
}

// CapabilityMask is the capability set of a workspace's root as
// /proc/<pid>/status shows it (CapBnd, and CapEff/CapPrm of root).
func CapabilityMask() uint64 {
	var m uint64
	for c := range keptCapabilities {
		m |= 1 << uint(c)
	}
	return m
}

func dropCapabilities() error {
	last := unix.CAP_LAST_CAP
	if b, err := os.ReadFile("/proc/sys/kernel/cap_last_cap"); err == nil {
		if n, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
			last = n
		}
	}
	for c := 0; c <= last; c++ {
		if keptCapabilities[c] {
			continue
		}
		if err := unix.Prctl(unix.PR_CAPBSET_DROP, uintptr(c), 0, 0, 0); err != nil && !errors.Is(err, unix.EINVAL) {
			return fmt.Errorf("init: drop capability %d: %w", c, err)
		}
	}
	_ = unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
	// No inheritable capabilities: after exec, root has exactly the
	// bounding set.
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return fmt.Errorf("init: capget: %w", err)
	}
	data[0].Inheritable, data[1].Inheritable = 0, 0
	if err := unix.Capset(&hdr, &data[0]); err != nil {
		return fmt.Errorf("init: capset: %w", err)
	}
	return nil
}
